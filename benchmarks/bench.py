"""Side-by-side performance of the generated project, measured in one invocation.

Renders the default project (digits) and one project per other dataset option, writes
stand-in data in each dataset's own on-disk format (with the generated tests' writers),
then measures, each question in one process with its sides interleaved:

1. the project's Trainer against a plain PyTorch loop (digits and mnist), per epoch;
2. time from `python train.py` to the first training step, and its import share;
3. training DataLoader throughput per dataset option at num_workers 0 and the default;
4. the cost of the progress bar (Lightning's TQDM and Rich bars, the project's paced TQDM
   bar) and of logging every step;
5. test accuracy of the default run (digits and mnist) beside a plain loop with the same
   network, and for digits beside an SVM on the same split;
   the project runs on a pseudo-terminal, so the bars draw as in a user's shell.

MNIST is the real one from ../shared/data/mnist where it is there (the table says which).

Prints a markdown table (medians, min, max, ratios) and writes everything to JSON.
"""

import argparse
import fcntl
import importlib
import json
import os
import pty
import shutil
import statistics
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from cookiecutter.main import cookiecutter
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10", "image_folder")
# The stand-in training sets have the real ones' sizes (cifar10: 5 batches of 10,000).
FULL_SIZES = {"idx": {"train": 60_000, "t10k": 10_000}, "cifar_per_batch": 10_000}
QUICK_SIZES = {"idx": {"train": 600, "t10k": 100}, "cifar_per_batch": 100}
# The official MNIST files, beside this repository (a generated project never refers to them).
SHARED_MNIST = REPO.parent / "shared" / "data" / "mnist"
# Digits: each data seed is another train/val/test split; 0, the default, is `python train.py`.
DIGITS_SEEDS = (0, 1, 2)


def write_folder(root: Path, files: int) -> list[str]:
    """An image folder of `files` small PNG files (10 classes, 90% train/, 10% test/), written
    once; its data arguments."""
    written = root / "data_args.json"
    if not written.exists():
        rng = np.random.default_rng(0)
        for index in range(files):
            split = "test" if index % 10 == 0 else "train"
            folder = root / split / f"class_{index // 10 % 10}"
            folder.mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{index:06d}.png")
        written.write_text(json.dumps(["--data.root", str(root), "--data.image_size", "28"]))
    return json.loads(written.read_text())


def render(dataset: str, output: Path) -> Path:
    """The project of this dataset option (package `proj`), rendered afresh into output from
    the template as it is now: a render kept from an earlier run would measure old code."""
    name = dataset.replace("_", "-")
    project = output / name
    shutil.rmtree(project, ignore_errors=True)
    context = {"dataset": dataset, "project_name": name, "package_name": "proj"}
    cookiecutter(str(REPO), no_input=True, output_dir=str(output), extra_context=context)
    if dataset == "image_folder":
        # The S3-compatible server the paths question reads shards through: a helper of the
        # library's tests (plain Python), which projects do not ship.
        shutil.copy(
            REPO / "library_tests" / "{{cookiecutter.project_slug}}" / "tests" / "s3_server.py",
            project / "tests",
        )
    return project


def write_data(project: Path, dataset: str, root: Path, quick: bool) -> list[str]:
    """Stand-in data written once by the project's own test writer (tests/fake_data.py)."""
    if dataset == "digits":
        return []
    fake_data = load_module(project / "tests" / "fake_data.py", f"fake_data_{dataset}")
    sizes = QUICK_SIZES if quick else FULL_SIZES
    if hasattr(fake_data, "SIZES"):
        fake_data.SIZES = sizes["idx"]
    if hasattr(fake_data, "TRAIN_PER_BATCH"):
        fake_data.TRAIN_PER_BATCH = sizes["cifar_per_batch"]
    written = root / "data_args.json"
    if not written.exists():
        args = fake_data.write_dataset(root)
        written.write_text(json.dumps(args))
    return json.loads(written.read_text())


def real_mnist(root: Path) -> list[str] | None:
    """The official MNIST files installed once under root, as data arguments; None without them."""
    install = SHARED_MNIST / "install.sh"
    if not install.is_file():
        return None
    if not (root / "MNIST" / "raw").is_dir():
        subprocess.run(["bash", str(install), str(root)], check=True, capture_output=True)
    return ["--data.root", str(root)]


def load_module(path: Path, name: str) -> Any:
    sys.path.insert(0, str(path.parents[1] / "src"))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.path.pop(0)
    return module


def environment(project: Path) -> dict[str, str]:
    paths = [str(project / "src"), str(project / "tests"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def measure(project: Path, question: str, out: Path, *args: str) -> Any:
    """Run measure.py for one project and question; its JSON result."""
    command = [sys.executable, str(REPO / "benchmarks" / "measure.py"), question]
    command += ["--package", "proj", "--out", str(out), *args]
    in_terminal(command, cwd=project, env=environment(project))
    return json.loads(out.read_text())


def in_terminal(command: list[str], cwd: Path, env: dict[str, str]) -> None:
    """Run `command` with its output on a pseudo-terminal of 120 x 40, as `python train.py`
    in a shell: progress bars draw there as they would for a user (into a pipe they stay
    still and cost nothing). What they draw is read and dropped; the tail is shown on failure.
    """
    reader, writer = pty.openpty()
    fcntl.ioctl(writer, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    try:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=writer, stderr=writer
        )
    finally:
        os.close(writer)
    tail = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(reader, 65536)
            except OSError:  # EIO: every writer has closed
                return
            if not chunk:
                return
            tail.extend(chunk)
            del tail[:-8192]

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    code = process.wait()
    thread.join()
    os.close(reader)
    if code:
        output = tail.decode(errors="replace")
        raise subprocess.CalledProcessError(code, command, output=output)


def wall_time(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


FIRST_STEP = """
import json, sys, time
from lightning.pytorch import Callback
from proj.kit.project import use
from proj.kit.train import main
from proj.project import project
use(project)  # as train.py does
imported = time.time()
class FirstStep(Callback):
    def on_train_batch_start(self, *args):
        if not hasattr(self, "at"):
            self.at = time.time()
            print(json.dumps({"imported": imported, "first_step": self.at}), file=sys.stderr)
main(sys.argv[1:], callbacks=[FirstStep()])
"""


def startup(project: Path, rounds: int, accelerator: str) -> dict[str, list[float]]:
    """`python train.py --help`, `import lightning`, and launch to first training step."""
    env = environment(project)
    python = sys.executable
    results: dict[str, list[float]] = {}
    for _ in range(rounds):
        results.setdefault("python_start", []).append(
            wall_time([python, "-c", "pass"], project, env)
        )
        results.setdefault("import_lightning", []).append(
            wall_time([python, "-c", "import lightning.pytorch"], project, env)
        )
        results.setdefault("train_help", []).append(
            wall_time([python, "train.py", "--help"], project, env)
        )
        args = ["--max_epochs", "1", "--accelerator", accelerator, "--devices", "1",
                "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "1",
                "--trainer.limit_test_batches", "1"]  # fmt: skip
        start = time.time()
        done = subprocess.run(
            [python, "-c", FIRST_STEP, *args], cwd=project, env=env, capture_output=True, text=True
        )
        marks = [
            json.loads(line) for line in done.stderr.splitlines() if line.startswith('{"imported"')
        ]
        if not marks:
            raise RuntimeError(f"no first training step:\n{done.stderr[-2000:]}")
        results.setdefault("to_first_step", []).append(marks[0]["first_step"] - start)
        results.setdefault("imports_before_first_step", []).append(marks[0]["imported"] - start)
    return results


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def epoch_medians(run: dict[str, Any], key: str = "total") -> float:
    """Median over a run's epochs after the first (which pays one-off start-up costs)."""
    values = [epoch[key] for epoch in run["epochs"]]
    return statistics.median(values[1:] or values)


SIDES = {
    "trainer": "Trainer (project as generated)",
    "plain_fast_data": "plain loop, the project's data path",
    "plain_classic": "plain loop, classic per-image transforms + workers",
}


def row(measure: str, unit: str, values: list[float]) -> dict[str, Any]:
    return {"measure": measure, "unit": unit, **spread(values)}


def summarise_compare(dataset: str, results: dict[str, list[dict[str, Any]]]) -> list[dict]:
    """Per side, the median epoch of each round; ratios taken round by round."""
    epoch = {name: [epoch_medians(run) for run in results[name]] for name in results}
    rows = [row(f"{dataset}: epoch, {label}", "s", epoch[name]) for name, label in SIDES.items()]
    fastest = {name: [min(e["total"] for e in run["epochs"][1:]) for run in results[name]]
               for name in SIDES}  # fmt: skip
    for name, label in (("plain_fast_data", "same data path"), ("plain_classic", "classic path")):
        ratios = [t / p for t, p in zip(epoch["trainer"], epoch[name], strict=True)]
        rows.append(row(f"{dataset}: Trainer / plain loop ({label})", "x", ratios))
        # The least disturbed epoch of each side: on a busy machine, the steadiest figure.
        ratios = [t / p for t, p in zip(fastest["trainer"], fastest[name], strict=True)]
        rows.append(row(f"{dataset}: Trainer / plain loop ({label}), fastest epochs", "x", ratios))
    runs = results["trainer"]
    parts = {
        key: [epoch_medians(run, key) for run in runs]
        for key in ("steps", "validation", "checkpoint")
    }
    rest = [t - sum(p) for t, *p in zip(epoch["trainer"], *parts.values(), strict=True)]
    fixed = [
        v + c + r for v, c, r in zip(parts["validation"], parts["checkpoint"], rest, strict=True)
    ]
    for label, values in (
        ("validation loop", parts["validation"]),
        ("checkpoint writes", parts["checkpoint"]),
        ("rest (epoch-end logging, progress bar, callbacks)", rest),
        ("sum of fixed costs", fixed),
    ):
        rows.append(row(f"{dataset}: Trainer per epoch, {label}", "s", values))
    rows.append(
        row(
            f"{dataset}: Trainer, one drawing of the curves (at most one a minute, and at fit end)",
            "s",
            [statistics.median(run["drawings"]) for run in runs],
        )
    )
    for on, off, label in (
        ("trainer", "trainer_no_progress_bar", "progress bar (on vs off)"),
        ("trainer_paced_bar", "trainer", "the paced TQDM bar (vs the default bar)"),
        ("trainer_rich_bar", "trainer", "Lightning's Rich bar (vs the default bar)"),
        ("trainer_log_every_step", "trainer_log_never", "logging every step (vs never)"),
        ("trainer", "trainer_log_never", "logging every 10 steps, the default (vs never)"),
    ):
        if on not in results or off not in results:
            continue
        costs = [
            (epoch_medians(a, "steps") - epoch_medians(b, "steps")) / a["steps_per_epoch"] * 1e3
            for a, b in zip(results[on], results[off], strict=True)
        ]
        rows.append(row(f"{dataset}: cost per training step of {label}", "ms", costs))
    for name, label in SIDES.items():
        rows.append(
            row(
                f"{dataset}: last-epoch train loss, {label}",
                "",
                [r["losses"][-1] for r in results[name]],
            )
        )
        rows.append(
            row(
                f"{dataset}: final val loss, {label}",
                "",
                [r["val_losses"][-1] for r in results[name]],
            )
        )
    return rows


def summarise_accuracy(label: str, result: dict[str, Any]) -> list[dict]:
    """Per seed: test accuracy and seconds per epoch of the default run and the plain loop."""
    runs = result["runs"]
    epochs = result["epochs"]
    rows = [
        row(f"{label}: test accuracy, default run ({epochs} epochs, best checkpoint)", "",
            [r["test_acc"] for r in runs]),
        row(f"{label}: test accuracy, plain loop (same network and data, last epoch)", "",
            [r["plain"]["test_acc"] for r in runs]),
        row(f"{label}: s per epoch, default run", "s", [epoch_medians(r) for r in runs]),
        row(f"{label}: s per epoch, plain loop", "s", [epoch_medians(r["plain"]) for r in runs]),
    ]  # fmt: skip
    if "svc_test_acc" in runs[0]:
        svc = [r["svc_test_acc"] for r in runs]
        rows.append(row(f"{label}: test accuracy, SVC(gamma=0.001) on the same split", "", svc))
        ours = [r["test_acc"] - s for r, s in zip(runs, svc, strict=True)]
        rows.append(row(f"{label}: test accuracy, default run minus SVC", "", ours))
    return rows


def summarise_startup(results: dict[str, list[float]]) -> list[dict]:
    labels = {
        "python_start": "python -c pass",
        "import_lightning": "python -c 'import lightning.pytorch'",
        "train_help": "python train.py --help",
        "to_first_step": "python train.py to the first training step",
        "imports_before_first_step": "  of which start-up and imports",
    }
    rows = [row(f"start-up: {label}", "s", results[key]) for key, label in labels.items()]
    help_over = [
        h - i for h, i in zip(results["train_help"], results["import_lightning"], strict=True)
    ]
    rows.append(row("start-up: --help minus import lightning", "s", help_over))
    share = [
        i / t
        for i, t in zip(results["imports_before_first_step"], results["to_first_step"], strict=True)
    ]
    rows.append(row("start-up: import share of time to first step", "x", share))
    return rows


def summarise_throughput(dataset: str, results: dict[str, list[float]]) -> list[dict]:
    return [row(f"loader {dataset}: {key}", "samples/s", values) for key, values in results.items()]


def targets(mnist_batches: int | None) -> dict[str, str]:
    """The targets of the measures that have one (issue "Less waiting"), by measure name."""
    mnist = "at most 1.10" if mnist_batches else "at most 1.05"
    return {
        "digits: Trainer / plain loop (same data path)": "at most 1.15",
        "digits: Trainer per epoch, sum of fixed costs": "at most 0.015",
        "mnist (real MNIST): Trainer / plain loop (same data path)": mnist,
        "mnist (real MNIST), full epochs: Trainer / plain loop (same data path)": "at most 1.05",
        "journey: total": "at most 15",
    }


def comparisons(
    options: argparse.Namespace, labels: dict[str, str]
) -> list[tuple[str, str, int | None, int, int]]:
    """(dataset, label, batches per epoch or None for all, rounds, epochs) of each Trainer /
    plain loop comparison: one per --compare dataset, and mnist's full epochs too when its
    epochs are cut to --mnist-batches (fewer rounds and epochs: one takes a while)."""
    rounds, epochs = (1, 2) if options.quick else (options.rounds, options.epochs)
    planned = []
    for dataset in options.compare:
        limit = 3 if options.quick else (options.mnist_batches if dataset == "mnist" else None)
        planned.append((dataset, labels[dataset], limit, rounds, epochs))
        if dataset == "mnist" and options.mnist_batches and options.mnist_full_rounds:
            label = f"{labels[dataset]}, full epochs"
            planned.append((dataset, label, None, options.mnist_full_rounds, min(epochs, 2)))
    return planned


def table(rows: list[dict[str, Any]], goals: dict[str, str] | None = None) -> str:
    goals = goals or {}
    lines = ["| measure | unit | median | min | max | target |", "|---|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(
            f"| {r['measure']} | {r['unit']} "
            f"| {r['median']:.4g} | {r['min']:.4g} | {r['max']:.4g} "
            f"| {goals.get(r['measure'], '')} |"
        )
    return "\n".join(lines)


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least `minimum` (a negative count is refused
    while the options are read, not after the first measurements)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text} is not a whole number of at least {minimum}")
        return value

    return parse


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny data, one round: checks the harness"
    )
    parser.add_argument("--rounds", type=at_least(1), default=3, help="A/B rounds per comparison")
    parser.add_argument(
        "--epochs",
        type=at_least(2),
        default=4,
        help="epochs per fit; the first is not counted, a fit's figure is the others' median",
    )
    parser.add_argument(
        "--mnist-batches",
        type=at_least(1),
        default=None,
        help="training (and validation) batches per mnist epoch; default: all",
    )
    parser.add_argument(
        "--loader-batches", type=at_least(1), default=100, help="batches per loader throughput pass"
    )
    parser.add_argument(
        "--mnist-full-rounds",
        type=at_least(0),
        default=1,
        help="with --mnist-batches: rounds of a comparison with full mnist epochs too (two "
        "epochs, the second counted, after an untimed fit of each kind: about 10 minutes on 2 "
        "CPU cores); 0: skip it",
    )
    parser.add_argument("--compare", nargs="*", default=["digits", "mnist"], choices=DATASETS)
    parser.add_argument("--loaders", nargs="*", default=list(DATASETS), choices=DATASETS)
    parser.add_argument(
        "--accuracy",
        nargs="*",
        default=["digits", "mnist"],
        choices=["digits", "mnist"],
        help="default runs to train in full and test (mnist: about 6 minutes on 2 CPU cores)",
    )
    parser.add_argument(
        "--threads",
        type=at_least(1),
        default=None,
        help="torch CPU threads (1 steadies a shared machine)",
    )
    parser.add_argument(
        "--folder-files",
        type=at_least(0),
        default=50_000,
        help="files of the image folder that the data paths (files, local shards, S3 shards) "
        "read; 0: skip them",
    )
    parser.add_argument(
        "--journey-rounds",
        type=at_least(0),
        default=3,
        help="rounds of cookiecutter -> train -> ONNX export -> server up -> one prediction "
        "(benchmarks/journey.py); 0: skip it",
    )
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "bench")
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON file (default: workdir/results.json)"
    )
    options = parser.parse_args(argv)
    rounds = 1 if options.quick else options.rounds
    workdir = options.workdir / ("quick" if options.quick else "full")
    workdir.mkdir(parents=True, exist_ok=True)
    device = ["--accelerator", options.accelerator]
    device += [] if options.threads is None else ["--threads", str(options.threads)]
    common = [*device, "--rounds", str(rounds)]
    folder_files = min(options.folder_files, 300) if options.quick else options.folder_files
    paths = ["image_folder"] if folder_files else []
    used = sorted({"digits", *options.compare, *options.loaders, *options.accuracy, *paths})
    projects = {d: render(d, workdir / "projects") for d in used}
    data = {
        d: write_data(projects[d], d, workdir / "data" / d, options.quick)
        for d in used
        if d in {"digits", *options.compare, *options.loaders, *options.accuracy}
    }
    mnist = None if options.quick or "mnist" not in used else real_mnist(workdir / "data" / "real")
    if mnist is not None:
        data["mnist"] = mnist
    source = "real MNIST" if mnist is not None else "stand-in data"
    labels = {d: d for d in used} | {"mnist": f"mnist ({source})"}
    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {"options": {k: str(v) for k, v in vars(options).items()}}
    raw["mnist_data"] = source
    for dataset, label, limit, n_rounds, n_epochs in comparisons(options, labels):
        args = [*device, "--rounds", str(n_rounds), "--epochs", str(n_epochs)]
        args += ["--data-args", json.dumps(data[dataset])]
        args += [] if limit is None else ["--limit", str(limit)]
        # The per-step costs of the progress bar and logging are measured where steps are
        # short (digits); on mnist those extra fits would only double the time.
        args += [] if dataset == "digits" else ["--no-overhead-variants"]
        key = dataset if label == labels[dataset] else f"{dataset}-full"
        result = measure(projects[dataset], "compare", workdir / f"compare-{key}.json", *args)
        raw[f"compare/{key}"] = result
        rows += summarise_compare(label, result)
    # A count, not a time: per-step overhead that a busy machine's noise does not hide.
    limit = ["--limit", "3"] if options.quick else []
    out = workdir / "calls-digits.json"
    raw["calls"] = measure(projects["digits"], "calls", out, "--epochs", "3", *limit)
    rows += [
        row("digits: Python calls per training step, Trainer", "calls", [raw["calls"]["trainer"]]),
        row("digits: Python calls per training step, plain loop", "calls", [raw["calls"]["plain"]]),
    ]
    raw["startup"] = startup(projects["digits"], rounds, options.accelerator)
    rows += summarise_startup(raw["startup"])
    for dataset in options.loaders:
        limit = 3 if options.quick else options.loader_batches
        args = [*common, "--data-args", json.dumps(data[dataset]), "--limit", str(limit)]
        result = measure(projects[dataset], "throughput", workdir / f"loader-{dataset}.json", *args)
        raw[f"throughput/{dataset}"] = result
        rows += summarise_throughput(dataset, result)
    for dataset in options.accuracy:
        args = [*common, "--data-args", json.dumps(data[dataset]), "--package-dataset", dataset]
        seeds = DIGITS_SEEDS if dataset == "digits" and not options.quick else (0,)
        args += ["--seeds", *map(str, seeds)]
        args += ["--limit", "3", "--epochs", "2"] if options.quick else []
        out = workdir / f"accuracy-{dataset}.json"
        raw[f"accuracy/{dataset}"] = measure(projects[dataset], "accuracy", out, *args)
        rows += summarise_accuracy(labels[dataset], raw[f"accuracy/{dataset}"])
    if folder_files:
        folder = write_folder(workdir / "data" / f"folder-{folder_files}", folder_files)
        limit = 3 if options.quick else options.loader_batches
        args = [*common, "--data-args", json.dumps(folder), "--limit", str(limit)]
        out = workdir / "paths.json"
        raw["paths"] = measure(projects["image_folder"], "paths", out, *args)
        label = f"image folder of {folder_files:,} files"
        unit = {"samples/s": "samples/s"}
        rows += [
            row(f"{label}: {key}", unit.get(key.rsplit(": ", 1)[-1], "s"), values)
            for key, values in raw["paths"].items()
        ]
    journey_rounds = min(1, options.journey_rounds) if options.quick else options.journey_rounds
    if journey_rounds:
        journey = load_module(Path(__file__).with_name("journey.py"), "journey")
        args = ["--rounds", str(journey_rounds), "--workdir", str(workdir / "journey")]
        stages = journey.main(args + (["--max-epochs", "5"] if options.quick else []))
        raw["journey"] = stages
        rows += [row(f"journey: {stage}", "s", values) for stage, values in stages.items()]
    text = table(rows, targets(options.mnist_batches))
    print(text)
    out = options.out or workdir / "results.json"
    out.write_text(json.dumps({"rows": rows, "raw": raw, "table": text}, indent=1))
    print(f"\nwritten: {out}")
    return rows


if __name__ == "__main__":
    main()
