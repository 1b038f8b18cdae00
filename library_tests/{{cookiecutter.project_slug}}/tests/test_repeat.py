"""Repeated runs over seeds and folds, their summary, the table of runs, diffs and comparisons."""

import csv
import io
import json
import math
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import FAST
from lightning import Callback, LightningModule, Trainer
from scipy import stats

from {{ cookiecutter.package_name }}.kit.cli import configured_loggers
from {{ cookiecutter.package_name }}.kit.errors import ConfigError
from {{ cookiecutter.package_name }}.kit.repeat import RUN_ENV
from {{ cookiecutter.package_name }}.kit.repeat import run as repeat
from {{ cookiecutter.package_name }}.kit.results import compare, diff, table
from {{ cookiecutter.package_name }}.kit.runs import logger_in


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def metrics_of(run: Path) -> dict[str, float]:
    return json.loads((run / "test_metrics.json").read_text())


def test_repeats_over_seeds_write_a_run_each_and_a_summary_that_matches_them(
    workspace: Path, data_args: list[str], capsys: pytest.CaptureFixture
) -> None:
    summary = repeat(["--seeds", "3", *FAST, *data_args])
    folder = workspace / "runs" / "repeats" / "default"
    runs = [folder / f"seed_{seed}" / "version_0" for seed in range(3)]
    for seed, run in enumerate(runs):
        assert yaml.safe_load((run / "config.yaml").read_text())["seed_everything"] == seed
        assert (run / "val_metrics.json").is_file()
    values = [metrics_of(run)["test/loss"] for run in runs]
    assert len(set(values)) == 3, "the seeds changed nothing"
    written = json.loads((folder / "summary.json").read_text())
    assert written == summary
    for key in ("test/acc", "test/loss", "val/loss"):
        per_seed = [summary["runs"][f"seed_{seed}"][key] for seed in range(3)]
        if key.startswith("test/"):
            assert per_seed == [metrics_of(run)[key] for run in runs]
        described = summary["metrics"][key]
        assert described["n"] == 3
        assert described["mean"] == pytest.approx(statistics.fmean(per_seed))
        assert described["std"] == pytest.approx(statistics.stdev(per_seed))
        half = stats.t.ppf(0.975, 2) * statistics.stdev(per_seed) / math.sqrt(3)
        assert described["ci95"] == pytest.approx(half)
    shown = capsys.readouterr().out
    assert f"{summary['metrics']['test/acc']['mean']:.4f} ± " in shown
    assert "| test/acc |" in (folder / "summary.md").read_text()


class PowerCut(Callback):
    """Stops the third seed's run after its first epoch, as a crash would."""

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if os.environ.get(RUN_ENV) == "seed_2" and trainer.current_epoch == 1:
            raise RuntimeError("power cut")


def test_a_stopped_repeat_runs_only_what_is_missing(
    workspace: Path, data_args: list[str], capsys: pytest.CaptureFixture
) -> None:
    args = ["--seeds", "3", *FAST, *data_args]
    with pytest.raises(RuntimeError, match="power cut"):
        repeat(args, callbacks=[PowerCut()])
    folder = workspace / "runs" / "repeats" / "default"
    done = {s: (folder / s / "version_0" / "test_metrics.json") for s in ("seed_0", "seed_1")}
    written = {seed: path.stat().st_mtime_ns for seed, path in done.items()}
    stopped = folder / "seed_2" / "version_0"
    assert (stopped / "checkpoints" / "last.ckpt").is_file()
    assert not (stopped / "test_metrics.json").exists()
    capsys.readouterr()

    summary = repeat(args)
    assert "2 of 3 run(s) finished, 1 to run" in capsys.readouterr().out
    assert {seed: path.stat().st_mtime_ns for seed, path in done.items()} == written
    # The third run went on in its own folder from its checkpoint, not from the start.
    assert sorted(p.name for p in (folder / "seed_2").iterdir()) == ["version_0"]
    assert (stopped / "test_metrics.json").is_file()
    assert sorted(summary["runs"]) == ["seed_0", "seed_1", "seed_2"]


def test_cross_validation_trains_each_fold_and_summarises_the_validation_metrics(
    workspace: Path, data_args: list[str]
) -> None:
    summary = repeat(["--folds", "3", *FAST, *data_args])
    folder = workspace / "runs" / "repeats" / "default"
    for fold in range(3):
        run = folder / f"fold_{fold}" / "version_0"
        data = yaml.safe_load((run / "config.yaml").read_text())["data"]["init_args"]
        assert (data["folds"], data["fold"]) == (3, fold)
    assert sorted(summary["runs"]) == ["fold_0", "fold_1", "fold_2"]
    # The validation metrics of each fold's best epoch, and each fold's model tested too.
    for key, file in (("val/loss", "val_metrics.json"), ("test/acc", "test_metrics.json")):
        values = [
            json.loads((folder / f"fold_{fold}" / "version_0" / file).read_text())[key]
            for fold in range(3)
        ]
        described = summary["metrics"][key]
        assert described["n"] == 3
        assert described["mean"] == pytest.approx(statistics.fmean(values))
        assert described["std"] == pytest.approx(statistics.stdev(values))


@pytest.mark.slow
def test_repeats_on_two_devices_run_each_seed_once_with_both_processes(
    tmp_path: Path, data_args: list[str]
) -> None:
    """Lightning's launcher starts the second process by running the command again: it joins
    the run the first process is in, and no run starts twice."""
    script = tmp_path / "repeat_offline.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import fake_data\n"
        "from {{ cookiecutter.package_name }}.kit.repeat import run\n"
        "from {{ cookiecutter.package_name }}.kit.project import use\n"
        "from {{ cookiecutter.package_name }}.project import project\n"
        "use(project)  # as the entry scripts do\n"
        "# The tiny CIFAR-10 files need trusting, in every process a DDP run starts too.\n"
        "getattr(fake_data, 'trust_local_files', lambda: None)()\n"
        "if __name__ == '__main__':\n"
        "    run()\n"
    )
    command = [sys.executable, str(script), "--seeds", "2", *FAST, *data_args, "--devices", "2"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    folder = tmp_path / "runs" / "repeats" / "default"
    found = sorted(p.relative_to(folder).as_posix() for p in folder.glob("*/version_*"))
    assert found == ["seed_0/version_0", "seed_1/version_0"]
    output = result.stdout + result.stderr
    assert output.count("x 2 device(s)") == 2, output[-3000:]  # each run had both processes
    summary = json.loads((folder / "summary.json").read_text())
    assert sorted(summary["runs"]) == ["seed_0", "seed_1"]


def test_a_repeat_refuses_other_flags_in_the_same_folder_and_flags_it_sets_itself(
    workspace: Path, data_args: list[str], capsys: pytest.CaptureFixture
) -> None:
    folder = workspace / "runs" / "repeats" / "default"
    checkpoints = folder / "seed_0" / "version_0" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "last.ckpt").touch()  # a run of those flags, to resume
    made = {"train_args": ["--max_epochs", "9"], "folds": None}
    (folder / "repeat.json").write_text(json.dumps(made))
    with pytest.raises(SystemExit, match=r"other flags \(--max_epochs 9\); give --name"):
        repeat(["--seeds", "2", *FAST, *data_args])
    with pytest.raises(SystemExit):
        repeat(["--seeds", "2", "--seed_everything", "3"])
    assert "--seed_everything is set by repeat.py for each run" in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == ["repeat.json", "seed_0"]  # nothing ran
    assert json.loads((folder / "repeat.json").read_text()) == made


def test_a_config_file_yaml_cannot_read_is_named(workspace: Path) -> None:
    """As train.py names it: the file and the line, not jsonargparse's "<unicode string>"."""
    config = workspace / "mine.yaml"
    config.write_text("trainer:\n  max_epochs: [\n")
    with pytest.raises(SystemExit) as exit_info:
        repeat(["--seeds", "2", "--config", str(config)])
    assert str(exit_info.value).startswith(f"error: {config} is not valid YAML at line 3")


def test_flags_refused_as_the_first_run_sets_up_leave_the_folder_to_the_corrected_command(
    workspace: Path, data_args: list[str]
) -> None:
    """Too many folds for a class is found when the data is read, after the folder exists."""
    with pytest.raises(SystemExit, match=r"data\.folds 500: the smallest class has"):
        repeat(["--folds", "500", "--name", "cv", *FAST, *data_args])
    summary = repeat(["--folds", "2", "--name", "cv", *FAST, *data_args])
    assert sorted(summary["runs"]) == ["fold_0", "fold_1"]
    made = json.loads((workspace / "runs" / "repeats" / "cv" / "repeat.json").read_text())
    assert made["folds"] == 2


def test_a_repeat_of_a_config_from_before_the_library_names_where_its_class_moved(
    workspace: Path, data_args: list[str]
) -> None:
    old = "{{ cookiecutter.package_name }}.callbacks.EpochLine"
    new = "{{ cookiecutter.package_name }}.kit.callbacks.EpochLine"
    (workspace / "old.yaml").write_text(f"epoch_line:\n  class_path: {old}\n")
    with pytest.raises(SystemExit) as stop:
        repeat(["--seeds", "2", "--config", "old.yaml", *FAST, *data_args])
    message = str(stop.value)
    assert f"epoch_line {old} moved: it is {new} now" in message, message
    assert len(message.splitlines()) == 1
    assert not (workspace / "runs").exists()  # refused before any run


def test_the_runs_table_shows_only_the_hyperparameters_that_differ_best_first(
    train: Callable, workspace: Path
) -> None:
    for lr in ("0.001", "0.01"):
        train("--model.optimizer.init_args.lr", lr)
    train("--model.optimizer.init_args.lr", "0.0001", "--trainer.enable_progress_bar", "true")
    rows = list(csv.DictReader(io.StringIO(table([Path("runs")], "test/loss", "csv"))))
    # Beside the run, its date, its metrics and its count: only the key that differs (not
    # how the progress was shown).
    assert [key for key in rows[0] if not key.startswith("test/")] == [
        "run", "date", "model.optimizer.lr", "runs"
    ]  # fmt: skip
    losses = [float(row["test/loss"]) for row in rows]
    assert losses == sorted(losses)  # best (lowest loss) first
    assert sorted(row["model.optimizer.lr"] for row in rows) == ["0.0001", "0.001", "0.01"]
    accuracies = [
        float(row["test/acc"])
        for row in csv.DictReader(io.StringIO(table([Path("runs")], "test/acc", "csv")))
    ]
    assert accuracies == sorted(accuracies, reverse=True)  # best (highest accuracy) first
    assert table([Path("runs")], "test/acc", "markdown").splitlines()[1].startswith("| --- |")


def test_the_config_diff_names_exactly_the_changed_keys(train: Callable, workspace: Path) -> None:
    train()
    # Another run folder too (as a repeat's run has): not a hyperparameter.
    elsewhere = logger_in(Path("runs") / "elsewhere", "other", configured_loggers([]))
    train(
        "--model.optimizer.init_args.lr", "0.01", "--max_epochs", "1", "--trainer.logger", elsewhere
    )
    runs = workspace / "runs"
    lines = diff(runs / "default" / "version_0", runs / "elsewhere" / "other" / "version_0")
    assert sorted(line.split(":")[0].strip() for line in lines) == [
        "model.optimizer.init_args.lr",
        "trainer.max_epochs",
    ]
    assert "  trainer.max_epochs: 2 -> 1" in lines


def write_repeat(folder: Path, values: dict[str, float], lr: float) -> None:
    """A repeat folder as repeat.py leaves it, with these test accuracies per seed."""
    folder.mkdir(parents=True)
    (folder / "repeat.json").write_text(json.dumps({"train_args": [], "folds": None}))
    for name, value in values.items():
        run = folder / name / "version_0"
        run.mkdir(parents=True)
        config = {"seed_everything": int(name.split("_")[1]), "model": {"lr": lr}}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        (run / "test_metrics.json").write_text(json.dumps({"checkpoint": "", "test/acc": value}))


def test_a_paired_comparison_weighs_the_difference_against_the_seed_spread(
    tmp_path: Path,
) -> None:
    base = {"seed_0": 0.90, "seed_1": 0.94, "seed_2": 0.92, "seed_3": 0.96}
    write_repeat(tmp_path / "a", base, 0.001)
    # b: better on every seed by far more than the spread; c: up on some seeds, down on others.
    better = {k: v + 0.05 + i * 0.001 for i, (k, v) in enumerate(base.items())}
    write_repeat(tmp_path / "b", better, 0.01)
    noisy = {k: v + (0.004 if i % 2 else -0.003) for i, (k, v) in enumerate(base.items())}
    write_repeat(tmp_path / "c", noisy, 0.1)
    clear = compare(tmp_path / "a", tmp_path / "b", "test/acc")
    a, b = list(base.values()), list(better.values())
    p = stats.ttest_rel(b, a).pvalue
    assert f"difference (second - first): {statistics.fmean(b) - statistics.fmean(a):+.4f}" in clear
    assert f"p = {p:.3g}" in clear
    assert "larger than the seed-to-seed spread" in clear
    assert "within the seed-to-seed spread" in compare(tmp_path / "a", tmp_path / "c", "test/acc")
    # As a table, each repeat is one row with its mean and spread over its 4 seeds.
    rows = list(csv.DictReader(io.StringIO(table([tmp_path], "test/acc", "csv"))))
    assert [row["run"] for row in rows] == [str(tmp_path / n) for n in ("b", "c", "a")]
    assert rows[2]["test/acc"] == f"{statistics.fmean(a):.4f}"  # numbers only, in a CSV file
    assert rows[2]["test/acc std"] == f"{statistics.stdev(a):.4f}"
    assert rows[2]["runs"] == "4" and "seed_everything" not in rows[0]
    text = table([tmp_path], "test/acc", "text").splitlines()[3]  # as text: mean ± std
    assert f"{statistics.fmean(a):.4f} ± {statistics.stdev(a):.4f}" in text
    # The same runs twice (or a constant shift): no spread of differences to test against.
    write_repeat(tmp_path / "same", base, 0.001)
    same = compare(tmp_path / "a", tmp_path / "same", "test/acc")
    assert "+0.0000 ± 0.0000, 95% CI +0.0000 .. +0.0000, no t-test: every pair differs" in same
    assert "nan" not in same
    assert "left out" not in same


def test_one_run_of_a_repeat_listed_alone_is_shown_as_itself(tmp_path: Path) -> None:
    write_repeat(tmp_path / "three", {"seed_0": 0.90, "seed_1": 0.94, "seed_2": 0.92}, 0.001)
    seed = tmp_path / "three" / "seed_0"
    rows = list(csv.DictReader(io.StringIO(table([seed], "test/acc", "csv"))))
    assert [(row["run"], row["runs"], row["test/acc"]) for row in rows] == [
        (str(seed / "version_0"), "1", "0.9000")
    ]
    (whole,) = csv.DictReader(io.StringIO(table([tmp_path / "three"], "test/acc", "csv")))
    assert (whole["run"], whole["runs"]) == (str(tmp_path / "three"), "3")


def test_a_comparison_names_the_runs_without_a_partner_and_a_metric_no_run_has(
    tmp_path: Path,
) -> None:
    write_repeat(tmp_path / "three", {"seed_0": 0.90, "seed_1": 0.94, "seed_2": 0.92}, 0.001)
    write_repeat(tmp_path / "two", {"seed_0": 0.91, "seed_1": 0.95}, 0.01)
    compared = compare(tmp_path / "three", tmp_path / "two", "test/acc")
    assert "over 2 paired runs (seed_0, seed_1)" in compared
    assert f"left out, finished in one folder only: seed_2 of {tmp_path / 'three'}" in compared
    with pytest.raises(ConfigError, match=r"^--metric test/acuracy: the runs have test/acc$"):
        compare(tmp_path / "three", tmp_path / "two", "test/acuracy")


def test_a_single_run_beside_a_repeat_differs_in_no_seed_or_fold(tmp_path: Path) -> None:
    write_repeat(tmp_path / "a", {"seed_0": 0.9, "seed_1": 0.92}, 0.001)
    single = tmp_path / "single" / "version_0"
    single.mkdir(parents=True)
    config = {"seed_everything": 0, "data": {"init_args": {"fold": 0}}, "model": {"lr": 0.01}}
    (single / "config.yaml").write_text(yaml.safe_dump(config))
    (single / "test_metrics.json").write_text(json.dumps({"checkpoint": "", "test/acc": 0.95}))
    rows = list(csv.DictReader(io.StringIO(table([tmp_path], "test/acc", "csv"))))
    assert list(rows[0]) == ["run", "date", "model.lr", "test/acc", "test/acc std", "runs"]
    assert [(row["test/acc"], row["test/acc std"]) for row in rows] == [
        ("0.9500", ""),
        ("0.9100", f"{statistics.stdev([0.9, 0.92]):.4f}"),
    ]


def test_the_table_ranks_by_the_direction_each_run_recorded(tmp_path: Path) -> None:
    # A metric whose name says nothing: lower is better because the runs recorded so.
    for name, value in (("a", 0.2), ("b", 0.1), ("c", 0.3)):
        run = tmp_path / name / "version_0"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(yaml.safe_dump({"model": {"tag": name}}))
        (run / "test_metrics.json").write_text(json.dumps({"checkpoint": "", "test/ece": value}))
        (run / "metric_directions.json").write_text(json.dumps({"val/ece": "min"}))
    rows = list(csv.DictReader(io.StringIO(table([tmp_path], "test/ece", "csv"))))
    assert [row["test/ece"] for row in rows] == ["0.1000", "0.2000", "0.3000"]
    for run in tmp_path.glob("*/version_0"):  # runs from before the record: by the name
        (run / "metric_directions.json").unlink()
    rows = list(csv.DictReader(io.StringIO(table([tmp_path], "test/ece", "csv"))))
    assert [row["test/ece"] for row in rows] == ["0.3000", "0.2000", "0.1000"]


def test_the_runs_table_starts_without_torch_or_lightning(tmp_path: Path) -> None:
    """results.py reads only what run folders record: it imports neither torch nor Lightning
    (a second, not a training run's start-up, for every table, diff and comparison)."""
    run = tmp_path / "runs" / "default" / "version_0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"model": {"tag": "a"}}))
    (run / "test_metrics.json").write_text(json.dumps({"checkpoint": "", "test/acc": 0.5}))
    script = (
        "import sys\n"
        "from {{ cookiecutter.package_name }}.kit.results import main\n"
        "main(['runs'])\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'lightning'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "0.5000" in done.stdout
    assert done.stdout.splitlines()[-1] == "[]"
