"""Repeated runs: one configuration over several seeds, or k-fold cross-validation, and a
summary of every metric with its mean, spread and 95% confidence interval.

python repeat.py --seeds 3                   train.py three times, with seeds 0, 1 and 2
python repeat.py --folds 5                   5-fold cross-validation: one run per fold
python repeat.py --seeds 3 --name nosmooth --model.loss.init_args.label_smoothing 0
python repeat.py --seeds 3                   again: runs what is missing, resumes what stopped
"""

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback

from .cli import configured_loggers, parse_only
from .errors import ConfigError
from .results import run_metrics, summarise, summary_table
from .runs import environment, logger_in
from .train import main as train

REPEATS = Path("runs/repeats")
# Lightning's DDP launcher starts the other processes of a run by running this same command
# again; this variable tells them which run to join instead of starting the first one.
RUN_ENV = "REPEAT_RUN"
# Flags the repeat sets for each run itself.
OWN_FLAGS = ("--trainer.logger", "--ckpt_path")


@dataclass(frozen=True)
class Run:
    """One run of a repeat: a seed, a fold, or both."""

    seed: int | None
    fold: int | None

    @property
    def name(self) -> str:
        parts = [f"seed_{self.seed}" if self.seed is not None else ""]
        parts.append(f"fold_{self.fold}" if self.fold is not None else "")
        return "-".join(part for part in parts if part)

    def flags(self, folds: int | None) -> list[str]:
        seed = ["--seed_everything", str(self.seed)] if self.seed is not None else []
        fold = ["--data.folds", str(folds), "--data.fold", str(self.fold)] if folds else []
        return [*seed, *fold]


@dataclass
class Repeat:
    """What one `repeat.py` command asks for."""

    name: str
    seeds: list[int] | None
    folds: int | None
    train_args: list[str]

    @property
    def folder(self) -> Path:
        return REPEATS / self.name

    def runs(self) -> list[Run]:
        seeds = self.seeds if self.seeds is not None else [None]
        folds = range(self.folds) if self.folds else [None]
        return [Run(seed, fold) for seed in seeds for fold in folds]


def seed_list(text: str) -> list[int]:
    """`3` is seeds 0, 1, 2; `1,7,42` those seeds."""
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count or a list like 1,7,42") from None
    if len(seeds) == 1:
        if seeds[0] < 2:
            raise argparse.ArgumentTypeError("repeat over 2 seeds or more")
        return list(range(seeds[0]))
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r} names a seed twice")
    return seeds


def fold_count(text: str) -> int:
    if not text.isdigit() or int(text) < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: cross-validation needs 2 folds or more")
    return int(text)


def command_line() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="repeat.py",
        usage="repeat.py [--seeds N|S1,S2,..] [--folds K] [--name NAME] [train.py flags]",
        description="Train one configuration several times, over seeds or cross-validation "
        f"folds (or both), into {REPEATS}/NAME/, and summarise the metrics of all runs.",
        epilog="Every other flag is a train.py flag and applies to every run (python train.py "
        "--help lists them). The same command again runs only what is missing.",
        allow_abbrev=False,
    )
    parser.add_argument("--seeds", type=seed_list, help="a count (0, 1, ...) or a list of seeds")
    parser.add_argument("--folds", type=fold_count, help="k of a stratified k-fold split")
    parser.add_argument("--name", default="default", help="the folder's name (default: default)")
    return parser


def parse(argv: Sequence[str]) -> Repeat:
    parser = command_line()
    known, rest = parser.parse_known_args(list(argv))
    if known.seeds is None and known.folds is None:
        parser.error("give --seeds, --folds or both")
    taken = [*OWN_FLAGS, *(["--seed_everything"] if known.seeds else [])]
    taken += ["--data.folds", "--data.fold"] if known.folds else []
    for flag in rest:
        if flag.split("=")[0] in taken:
            parser.error(f"{flag.split('=')[0]} is set by repeat.py for each run")
    return Repeat(known.name, known.seeds, known.folds, rest)


def check(repeat: Repeat) -> None:
    """Parse the train.py flags once before any run; refuse a folder whose runs had other
    flags. One whose flags were refused as its first run set up (too many folds for a class,
    say) holds no run: the corrected command takes it over."""
    parse_only(repeat.train_args)
    configured_loggers(repeat.train_args)  # each run needs a logger with a run folder
    manifest = repeat.folder / "repeat.json"
    wanted = manifest_of(repeat.train_args, repeat.folds)
    if manifest.is_file():
        made = json.loads(manifest.read_text())
        if {key: made.get(key) for key in wanted} == wanted:
            return
        if holds_runs(repeat.folder):
            given = " ".join(made["train_args"]) or "no train.py flags"
            folds = f", {made['folds']} folds" if made["folds"] else ""
            raise ConfigError(
                f"{repeat.folder} holds runs of other flags ({given}{folds}); give --name "
                "NAME for this configuration"
            )
    if is_first_process():
        write_manifest(repeat.folder, repeat.train_args, repeat.folds)


def holds_runs(folder: Path) -> bool:
    """Whether a run in `folder` got as far as a checkpoint (one to resume or a finished one)."""
    return any(folder.glob("*/version_*/checkpoints/*.ckpt"))


def manifest_of(train_args: list[str], folds: int | None) -> dict[str, Any]:
    """What repeat.json holds: what every run in the folder shares."""
    return {"train_args": train_args, "folds": folds}


def write_manifest(folder: Path, train_args: list[str], folds: int | None) -> None:
    """repeat.json: the runs in the folder are one configuration's."""
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(manifest_of(train_args, folds), indent=2)
    (folder / "repeat.json").write_text(text + "\n")


def is_first_process() -> bool:
    """Rank 0 of a torchrun or SLURM job (which start every process with this command)."""
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0))) == 0


def run(argv: list[str] | None = None, callbacks: Sequence[Callback] = ()) -> dict:
    """Train every missing run of the repeat, then write and print the summary."""
    try:
        repeat = parse(sys.argv[1:] if argv is None else argv)
        check(repeat)
    except ConfigError as error:
        sys.exit(f"error: {error}")
    runs = repeat.runs()
    if RUN_ENV in os.environ:  # one more process of a multi-device run
        (joined,) = [r for r in runs if r.name == os.environ[RUN_ENV]]
        return train_run(repeat, joined, callbacks)
    # Decided once, before any run: under torchrun every process walks the same list.
    missing = [r for r in runs if not finished(repeat.folder / r.name)]
    print(
        f"Repeat {repeat.name} in {repeat.folder}: {len(runs) - len(missing)} of {len(runs)} "
        f"run(s) finished, {len(missing)} to run"
    )
    for number, missed in enumerate(missing, 1):
        print(f"Run {missed.name} ({number} of {len(missing)} to run)")
        train_run(repeat, missed, callbacks)
    summary = summarise(repeat.folder, [r.name for r in runs])
    if is_first_process():
        (repeat.folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (repeat.folder / "summary.md").write_text(summary_table(summary, "markdown") + "\n")
        print(summary_table(summary, "text"))
        print(f"Summary: {repeat.folder / 'summary.md'} (and summary.json)")
    return summary


def finished(folder: Path) -> bool:
    """A run is finished when one of its run folders holds its test metrics."""
    return any(run_metrics(version) for version in folder.glob("version_*"))


def train_run(repeat: Repeat, run: Run, callbacks: Sequence[Callback]) -> dict[str, float]:
    """One train.py run into REPEATS/<name>/<run>/version_<N>; a stopped one resumes."""
    args = [*repeat.train_args, *run.flags(repeat.folds)]
    loggers = configured_loggers(repeat.train_args)
    args += ["--trainer.logger", logger_in(repeat.folder, run.name, loggers)]
    stopped = list((repeat.folder / run.name).glob("version_*/checkpoints/last.ckpt"))
    if stopped:
        args += ["--ckpt_path", str(max(stopped, key=lambda path: path.stat().st_mtime))]
    with environment(RUN_ENV, run.name):
        return train(args, callbacks)
