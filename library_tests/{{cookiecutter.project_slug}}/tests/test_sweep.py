"""sweep.py: an Optuna study of train.py runs that survives crashes and continues after a stop."""

import io
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import lightning as L
import optuna
import pytest
import yaml
from matplotlib.image import imread
from optuna.trial import TrialState

from {{ cookiecutter.package_name }}.kit import results, sweep
from {{ cookiecutter.package_name }}.kit.train import main

STUDY = Path("runs/sweeps/space")

# Each trial: two short epochs on a few batches, one process, quiet.
TRIAL_FLAGS = [
    "--accelerator", "cpu",
    "--devices", "1",
    "--max_epochs", "2",
    "--data.num_workers", "0",
    "--trainer.limit_train_batches", "3",
    "--trainer.limit_val_batches", "2",
    "--trainer.limit_test_batches", "1",
    "--trainer.log_every_n_steps", "1",
    "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false",
]  # fmt: skip

# Ranked by accuracy (at most 1): the pruning tests' thresholds rely on it.
SPACE = """
metric: val/acc
sampler:
  class_path: optuna.samplers.RandomSampler
  init_args: {seed: 0}
params:
  model.optimizer.lr: {low: 1.0e-4, high: 1.0e-1, log: true}
  data.batch_size: {choices: [8, 16]}
"""


@pytest.fixture
def run_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data_args: list[str]
) -> Iterator[Callable[..., None]]:
    """Run sweep.py in-process in tmp_path with a search space given as YAML text."""
    monkeypatch.chdir(tmp_path)
    sigint = signal.getsignal(signal.SIGINT)  # Lightning ignores Ctrl-C after an interrupt
    yield lambda space, *args: sweep.run(
        ["--config", write(tmp_path / "space.yaml", space), *TRIAL_FLAGS, *data_args, *args]
    )
    signal.signal(signal.SIGINT, sigint)


@pytest.fixture
def sweep_command(tmp_path: Path, data_args: list[str]) -> list[str]:
    """sweep.py in a subprocess in tmp_path, on the test data, with the SPACE search space."""
    script = tmp_path / "sweep_offline.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import fake_data\n"
        "from {{ cookiecutter.package_name }}.kit.sweep import run\n"
        "from {{ cookiecutter.package_name }}.kit.project import use\n"
        "from {{ cookiecutter.package_name }}.project import project\n"
        "use(project)  # as the entry scripts do\n"
        "# The tiny CIFAR-10 files need trusting, in every process a DDP trial starts too.\n"
        "getattr(fake_data, 'trust_local_files', lambda: None)()\n"
        "if __name__ == '__main__':\n"
        "    run()\n"
    )
    space = write(tmp_path / "space.yaml", SPACE)
    return [sys.executable, str(script), "--config", space, *TRIAL_FLAGS, *data_args]


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def trials() -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="space", storage=f"sqlite:///{STUDY}/study.db").trials


def saved_values(config: dict) -> dict[str, object]:
    """The two searched values as a saved train.py config holds them."""
    return {
        "model.optimizer.lr": config["model"]["optimizer"]["init_args"]["lr"],
        "data.batch_size": config["data"]["init_args"]["batch_size"],
    }


class RaiseInTrial(L.Callback):
    """Raises `error` during the first training step of one trial."""

    def __init__(self, trial: int, error: BaseException) -> None:
        self.folder = f"trial_{trial:03d}"
        self.error = error

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if self.folder in trainer.log_dir:
            raise self.error


def raise_in_trial(monkeypatch: pytest.MonkeyPatch, trial: int, error: BaseException) -> None:
    """Make every run of the sweep carry a RaiseInTrial callback."""
    monkeypatch.setattr(
        sweep, "main", lambda args, callbacks: main(args, [*callbacks, RaiseInTrial(trial, error)])
    )


def test_a_stopped_sweep_continues_where_it_stopped(
    run_sweep: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    raise_in_trial(monkeypatch, 1, KeyboardInterrupt())  # Ctrl-C
    with pytest.raises(SystemExit) as exit_info:
        run_sweep(SPACE, "--n_trials", "3")
    assert "Trial 1 is recorded as failed" in str(exit_info.value)
    first = trials()
    assert [t.state for t in first] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.WAITING]

    monkeypatch.setattr(sweep, "main", main)
    run_sweep(SPACE, "--n_trials", "3")
    again = trials()
    assert [t.state for t in again] == [TrialState.COMPLETE, TrialState.FAIL] + [
        TrialState.COMPLETE
    ] * 2
    assert (again[0].params, again[0].value) == (first[0].params, first[0].value)
    assert again[2].params == first[1].params  # the interrupted trial ran again first


# A KeyboardInterrupt raised in a finalizer would be printed as ignored (a traceback in the
# sweep's output, which pytest turns into PytestUnraisableExceptionWarning, an error here).
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_in_a_finalizer_stops_the_sweep_without_a_traceback(
    run_sweep: Callable, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(
        sweep, "main", lambda args, callbacks: main(args, [*callbacks, SignalWhenSetUp(1)])
    )
    with pytest.raises(SystemExit) as exit_info:
        run_sweep(SPACE, "--n_trials", "3")
    assert "Trial 1 is recorded as failed" in str(exit_info.value)
    first, stopped, _ = trials()
    assert [first.state, stopped.state] == [TrialState.COMPLETE, TrialState.FAIL]
    # Stopped at its first batch, not after training and validating as the trial before did.
    assert first.intermediate_values and not stopped.intermediate_values
    output = "".join(capfd.readouterr())
    assert "Traceback" not in output and "Exception ignored" not in output, output


class SignalWhenSetUp(L.Callback):
    """SIGTERM while a finalizer runs, as one trial sets up (before Lightning's own SIGTERM
    handler): the sweep's handler raises KeyboardInterrupt there, which Python only prints."""

    def __init__(self, trial: int) -> None:
        self.folder = f"trial_{trial:03d}"

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and self.folder in trainer.log_dir:
            SignalInFinalizer()  # collected at once


class SignalInFinalizer:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler runs here


def test_a_continued_study_tries_new_values(run_sweep: Callable) -> None:
    """A seeded sampler restarted with its own seed would draw the first trials' values again."""
    run_sweep(SPACE, "--n_trials", "2")
    run_sweep(SPACE, "--n_trials", "4")
    params = [trial.params for trial in trials()]
    assert len(params) == 4
    assert params[2] not in params[:2] and params[3] not in params[:2]


def test_each_trial_stops_its_loader_workers_before_the_next(
    run_sweep: Callable, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    """A pruned trial's loaders would otherwise outlive it, and be collected in a worker
    process of a later trial, printing tracebacks."""
    before = set(multiprocessing.active_children())
    seen = []  # the processes alive when each trial sets up, before its own loaders

    def leftovers() -> None:
        left = set(multiprocessing.active_children()) - before
        for process in left:
            process.join(timeout=10)  # stopping (terminated workers end asynchronously)
        seen.append({process for process in left if process.is_alive()})

    # A new callback for each trial, as the sweep's own: Lightning gives every callback a
    # reference to the run's model (`callback.log`), so one shared across trials would keep
    # the previous trial's model, trainer and loaders alive.
    monkeypatch.setattr(
        sweep, "main", lambda args, callbacks: main(args, [*callbacks, WhenSetUp(leftovers)])
    )
    prune = "pruner: {class_path: optuna.pruners.ThresholdPruner, init_args: {lower: 2.0}}\n"
    run_sweep(SPACE + prune, "--n_trials", "3", "--data.num_workers", "1")
    assert [t.state for t in trials()] == [TrialState.PRUNED] * 3
    assert seen == [set()] * 3
    assert "Traceback" not in capfd.readouterr().err


class WhenSetUp(L.Callback):
    """Calls `action` when a run sets up, before it starts any loader."""

    def __init__(self, action: Callable[[], None]) -> None:
        self.action = action

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.action()


def test_trial_lines_print_four_digits(run_sweep: Callable, capsys: pytest.CaptureFixture) -> None:
    run_sweep(SPACE, "--n_trials", "1")
    (trial,) = trials()
    line = f"Trial 0 finished: val/acc {trial.value:.4f} (best: trial 0, {trial.value:.4f})"
    assert line in capsys.readouterr().out


def test_report_best_config_and_plots(run_sweep: Callable, capsys: pytest.CaptureFixture) -> None:
    run_sweep(SPACE, "--n_trials", "2")
    done = trials()
    assert [t.state for t in done] == [TrialState.COMPLETE] * 2
    for trial in done:
        config = yaml.safe_load((Path(trial.user_attrs["run_folder"]) / "config.yaml").read_text())
        assert saved_values(config) == trial.params
    best = max(done, key=lambda t: t.value)
    out = capsys.readouterr().out
    assert f"Best trial: {best.number} with val/acc = {best.value:.4f}" in out

    main(["--config", str(STUDY / "best.yaml")])  # what the printed command runs
    rerun = Path("runs/default/version_0")  # a run of train.py's, not one more of the trial
    assert saved_values(yaml.safe_load((rerun / "config.yaml").read_text())) == best.params
    assert not Path(best.user_attrs["run_folder"]).with_name("version_1").exists()
    for name in ("history.png", "importances.png"):
        image = imread(STUDY / name)
        assert image.ndim == 3 and min(image.shape[:2]) > 100

    with pytest.raises(SystemExit) as exit_info:  # the same study, another goal
        run_sweep(SPACE.replace("metric: val/acc", "metric: val/loss"))
    assert "is to maximize val/acc, not to minimize val/loss" in str(exit_info.value)


def test_trials_are_ranked_by_the_monitored_metric_unless_the_space_names_one(
    run_sweep: Callable, capsys: pytest.CaptureFixture
) -> None:
    run_sweep(SPACE.replace("metric: val/acc\n", ""), "--n_trials", "1", "--monitor", "val/f1")
    study = optuna.load_study(study_name="space", storage=f"sqlite:///{STUDY}/study.db")
    (trial,) = study.trials
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    assert trial.value == max(trial.intermediate_values.values())
    assert f"Trial 0 finished: val/f1 {trial.value:.4f}" in capsys.readouterr().out
    config = yaml.safe_load((Path(trial.user_attrs["run_folder"]) / "config.yaml").read_text())
    assert config["monitor"] == "val/f1"  # its checkpoint, the one tested, is the best by F1


def test_importances_wait_for_two_different_completed_trials(
    run_sweep: Callable, capsys: pytest.CaptureFixture
) -> None:
    run_sweep(SPACE, "--n_trials", "1")
    assert "importances.png not written yet" in capsys.readouterr().out
    assert (STUDY / "history.png").is_file() and not (STUDY / "importances.png").exists()


def test_equal_results_are_said_once_without_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # Small data often gives two trials the same val/acc; Optuna then warns that every
    # importance is equal. The sweep says it in one line instead.
    study = optuna.create_study(direction="maximize")
    lr = optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)
    for value in (1e-3, 1e-2):
        study.add_trial(
            optuna.trial.create_trial(params={"lr": value}, distributions={"lr": lr}, value=0.5)
        )
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Target and region quantiles")
        sweep.save_plots(study, tmp_path, study.get_trials(states=[TrialState.COMPLETE]))
    assert "same result so far: the importances are equal" in capsys.readouterr().out
    assert (tmp_path / "importances.png").is_file()


def test_a_crashing_trial_is_recorded_as_failed_and_the_study_goes_on(
    run_sweep: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    raise_in_trial(monkeypatch, 1, RuntimeError("CUDA out of memory"))
    run_sweep(SPACE, "--n_trials", "3")
    assert [t.state for t in trials()] == [
        TrialState.COMPLETE,
        TrialState.FAIL,
        TrialState.COMPLETE,
    ]


def test_a_trial_that_train_py_rejects_is_recorded_as_failed(
    run_sweep: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    said = io.StringIO()
    monkeypatch.setattr(sweep.OPTUNA_HANDLER, "stream", said)
    # A batch size of 0 passes the type check before the sweep and stops train.py at once.
    with pytest.raises(SystemExit, match="Every trial failed"):  # exit status 1
        run_sweep(SPACE.replace("choices: [8, 16]", "choices: [0]"), "--n_trials", "1")
    (trial,) = trials()
    assert trial.state == TrialState.FAIL
    # Optuna's line for the failed trial holds train.py's own, without a traceback.
    assert "train.py stopped: error: data.batch_size must be a positive integer" in said.getvalue()
    assert "Traceback" not in said.getvalue()


def test_changed_choices_are_refused_before_any_trial_and_a_changed_range_is_said(
    run_sweep: Callable, capsys: pytest.CaptureFixture
) -> None:
    """Optuna fails every trial of a parameter whose choices changed; a changed range it
    samples from then on."""
    run_sweep(SPACE, "--n_trials", "1")
    assert "note:" not in capsys.readouterr().out  # a new study: nothing changed
    with pytest.raises(SystemExit) as exit_info:
        run_sweep(SPACE.replace("[8, 16]", "[8, 32]"), "--n_trials", "2")
    message = str(exit_info.value)
    assert message.startswith(
        "error: study space drew from other choices: "
        "data.batch_size choices [8, 16] then, choices [8, 32] now; "
    )
    assert "give --study NAME" in message and "\n" not in message
    assert len(trials()) == 1
    capsys.readouterr()
    run_sweep(SPACE.replace("high: 1.0e-1", "high: 0.5"), "--n_trials", "2")
    assert (
        "note: the search space changed since the study's earlier trials: "
        "model.optimizer.lr 0.0001 to 0.1 log then, 0.0001 to 0.5 log now"
    ) in capsys.readouterr().out
    assert [t.state for t in trials()] == [TrialState.COMPLETE] * 2


def test_unpromising_trials_are_pruned(run_sweep: Callable) -> None:
    # Every val/acc is below 1.1: the pruner stops the trial after its first validation.
    pruner = "pruner:\n  class_path: optuna.pruners.ThresholdPruner\n  init_args: {lower: 1.1}\n"
    run_sweep(SPACE + pruner, "--n_trials", "1")
    (trial,) = trials()
    assert trial.state == TrialState.PRUNED
    assert list(trial.intermediate_values) == [0]


def test_a_repeated_trial_is_the_mean_over_its_seeds(run_sweep: Callable) -> None:
    run_sweep(SPACE + "repeat: {seeds: 2}\n", "--n_trials", "2")
    for trial in trials():
        assert trial.state == TrialState.COMPLETE
        folder = STUDY / f"trial_{trial.number:03d}"
        runs = [folder / f"seed_{seed}" / "version_0" for seed in (0, 1)]
        configs = [yaml.safe_load((run / "config.yaml").read_text()) for run in runs]
        assert [config["seed_everything"] for config in configs] == [0, 1]
        # Both runs of a trial have its values.
        assert saved_values(configs[0]) == saved_values(configs[1]) == trial.params
        # Each run's best val/acc (val_metrics.json: the epoch of its best checkpoint).
        best = [json.loads((run / "val_metrics.json").read_text())["val/acc"] for run in runs]
        assert trial.value == pytest.approx(statistics.fmean(best))
        # The running mean after each run: what the pruner sees.
        assert trial.intermediate_values == pytest.approx({0: best[0], 1: statistics.fmean(best)})
    # results.py: a trial's runs are one row, and two trials compare seed by seed.
    rows = {row["folder"]: row for row in results.entries(results.find_runs([STUDY]))}
    assert sorted(rows) == [STUDY / "trial_000", STUDY / "trial_001"]
    assert all(row["metrics"]["test/acc"]["n"] == 2 for row in rows.values())
    compared = results.compare(STUDY / "trial_000", STUDY / "trial_001", "val/acc")
    assert compared.startswith("val/acc over 2 paired runs (seed_0, seed_1)")


def test_a_repeated_trial_is_pruned_on_the_running_mean(run_sweep: Callable) -> None:
    # Every val/acc is below 1.1: the pruner stops the trial after its first run.
    pruner = "pruner:\n  class_path: optuna.pruners.ThresholdPruner\n  init_args: {lower: 1.1}\n"
    run_sweep(SPACE + pruner + "repeat: {seeds: 3}\n", "--n_trials", "1")
    (trial,) = trials()
    assert trial.state == TrialState.PRUNED
    assert list(trial.intermediate_values) == [0]
    assert sorted(p.name for p in (STUDY / "trial_000").iterdir()) == ["repeat.json", "seed_0"]


@pytest.mark.parametrize(
    ("space", "message"),
    [
        (SPACE + "metrc: val/loss\n", "metrc"),
        (SPACE.replace("model.optimizer.lr", "model.optimizer.lrr"), "params.model.optimizer.lrr"),
        (SPACE.replace("low: 1.0e-4", "lo: 1.0e-4"), "params.model.optimizer.lr must be {low"),
        (SPACE.replace("high: 1.0e-1", "high: -1.0"), "params.model.optimizer.lr"),
        (SPACE.replace("choices: [8, 16]", "choices: [8, eight]"), "params.data.batch_size"),
        (SPACE + "repeat: {seeds: 1}\n", "repeat: {seeds: N or [S1, S2, ...], folds: K}"),
        (
            SPACE + "  seed_everything: {low: 0, high: 9}\nrepeat: {seeds: 2}\n",
            "seed_everything is set by the search space's repeat",
        ),
        (
            SPACE.replace("metric: val/acc", "metric: val/accuracy"),  # metric val/accuracy in
            "space.yaml is not a validation metric the model logs; accepted: val/loss",
        ),
    ],
    ids=[
        "unknown key",
        "unknown flag",
        "malformed range",
        "empty range",
        "wrong type",
        "bad repeat",
        "seed twice",
        "unlogged metric",
    ],
)
def test_a_bad_search_space_stops_in_one_line_before_any_trial(
    run_sweep: Callable, space: str, message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_sweep(space)
    assert message in str(exit_info.value) and "\n" not in str(exit_info.value)
    assert not Path("runs").exists()


def test_a_bad_train_flag_stops_in_one_line_before_any_trial(run_sweep: Callable) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_sweep(SPACE, "--model.lable_smoothing", "0.1")
    assert "lable_smoothing" in str(exit_info.value) and "\n" not in str(exit_info.value)
    assert not Path("runs").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("repeat", "expected"),
    [
        ("", ["trial_000/version_0", "trial_001/version_0"]),
        ("repeat: {seeds: 2}\n", ["trial_000/seed_0/version_0", "trial_000/seed_1/version_0"]),
    ],
    ids=["one run per trial", "two runs per trial"],
)
def test_ddp_trials_run_one_after_another(
    sweep_command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    repeat: str,
    expected: list[str],
) -> None:
    write(tmp_path / "space.yaml", SPACE + repeat)
    n_trials = 1 if repeat else 2
    result = subprocess.run(
        [*sweep_command, "--devices", "2", "--strategy", "ddp", "--n_trials", str(n_trials)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    study = tmp_path / STUDY
    monkeypatch.chdir(tmp_path)
    # The other process of each run joined it and started none of its own.
    assert [t.state for t in trials()] == [TrialState.COMPLETE] * n_trials
    found = sorted(p.relative_to(study).as_posix() for p in study.glob("trial_*/**/version_*"))
    assert found == expected
    config = yaml.safe_load((study / expected[-1] / "config.yaml").read_text())
    assert int(config["trainer"]["devices"]) == 2


@pytest.mark.slow
def test_sigterm_stops_the_sweep_and_the_same_command_continues(
    sweep_command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "output.txt"
    with log.open("w") as output:
        # Long trials, so that the signal arrives while the first one runs, with a loader
        # worker; the signal goes to the whole process group, as a scheduler sends it.
        process = subprocess.Popen(
            [*sweep_command, "--max_epochs", "100", "--n_trials", "2", "--data.num_workers", "1"],
            cwd=tmp_path, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        while not (tmp_path / STUDY / "trial_000").exists() and process.poll() is None:
            time.sleep(0.5)
        time.sleep(2)  # into the first epochs
        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(timeout=120) != 0
    assert "Trial 0 is recorded as failed" in log.read_text(), log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()
    monkeypatch.chdir(tmp_path)
    first = trials()
    assert [t.state for t in first] == [TrialState.FAIL, TrialState.WAITING]

    sweep.run([*sweep_command[2:], "--n_trials", "2"])
    again = trials()
    assert [t.state for t in again] == [TrialState.FAIL] + [TrialState.COMPLETE] * 2
    assert again[1].params == first[0].params
