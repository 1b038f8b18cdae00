"""Hyperparameter search with Optuna: each trial is a train.py run, the study a SQLite file.

python sweep.py --n_trials 20             the search space of configs/sweep/default.yaml
python sweep.py --config configs/sweep/default.yaml --max_epochs 5    train.py flags: every trial
python sweep.py --n_trials 20             again: continues the study where it stopped
"""

import argparse
import contextlib
import json
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import optuna
import yaml
from jsonargparse import ArgumentParser, lazy_instance
from lightning.pytorch.utilities.exceptions import SIGTERMException
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.pruners import BasePruner, MedianPruner
from optuna.samplers import BaseSampler, TPESampler
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, Trial, TrialState
from optuna_integration import PyTorchLightningPruningCallback

from .cli import SaveRunConfig, TrainCLI, main
from .data import DataModule
from .datamodule import ConfigError
from .model import ImageClassifier

SWEEPS = Path("runs/sweeps")
DEFAULT_SPACE = Path("configs/sweep/default.yaml")
SPACE_KEYS = ("metric", "direction", "sampler", "pruner", "params")
# Lightning's DDP launcher starts the other processes of a trial by running this same
# command again; this variable tells them which trial to join instead of starting one.
TRIAL_ENV = "SWEEP_TRIAL_ID"
# A trial whose process died without a word (kill -9, power cut) is failed, and retried
# once, when it has sent no heartbeat for GRACE_S seconds.
HEARTBEAT_S, GRACE_S = 10, 30


@dataclass
class Sweep:
    """What one `sweep.py` command asks for."""

    name: str
    metric: str
    direction: Literal["maximize", "minimize"]
    sampler: BaseSampler
    pruner: BasePruner
    space: dict[str, BaseDistribution]
    train_args: list[str]
    n_trials: int

    @property
    def folder(self) -> Path:
        return SWEEPS / self.name

    @property
    def url(self) -> str:
        return f"sqlite:///{self.folder / 'study.db'}"

    def storage(self) -> RDBStorage:
        return RDBStorage(
            self.url,
            heartbeat_interval=HEARTBEAT_S,
            grace_period=GRACE_S,
            heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1),
        )


def command_line() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sweep.py",
        usage="sweep.py [--config SPACE.yaml] [--n_trials N] [--study NAME] [train.py flags]",
        description="Search hyperparameters with Optuna; each trial is one train.py run. "
        f"--config names the search space (default: {DEFAULT_SPACE}), a YAML file with the keys "
        f"{', '.join(SPACE_KEYS)}.",
        epilog="Every other flag is a train.py flag and applies to every trial, training --config "
        "files included (python train.py --help lists them).",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--n_trials",
        type=int,
        default=20,
        help="finished trials the study should have; running again tops it up (default: 20)",
    )
    parser.add_argument(
        "--study",
        help="study name; its folder is runs/sweeps/<name> (default: the search space file's name)",
    )
    return parser


def parse(argv: list[str]) -> Sweep:
    """Read the command line and the search space; ConfigError names what is wrong."""
    path, argv = pop_search_space(argv)
    own, train_args = command_line().parse_known_args(argv)
    if own.n_trials < 1:
        raise ConfigError(f"--n_trials must be 1 or more, got {own.n_trials}")
    space = read_space(path)
    return Sweep(
        name=own.study or path.stem,
        metric=space.metric,
        direction=space.direction,
        sampler=space.sampler,
        pruner=space.pruner,
        space={key: distribution(key, spec) for key, spec in space.params.items()},
        train_args=train_args,
        n_trials=own.n_trials,
    )


def pop_search_space(argv: list[str]) -> tuple[Path, list[str]]:
    """Take the search space out of the arguments; other --config files are for training.

    A --config file is the search space when its top level has a search-space key.
    """
    spaces, rest = [], []
    args = iter(argv)
    for arg in args:
        if arg != "--config" and not arg.startswith("--config="):
            rest.append(arg)
            continue
        path = arg.partition("=")[2] or next(args, "")
        if is_search_space(Path(path)):
            spaces.append(Path(path))
        else:
            rest += ["--config", path]
    if len(spaces) > 1:
        raise ConfigError(f"give one search space, got {', '.join(map(str, spaces))}")
    if not spaces and not DEFAULT_SPACE.is_file():
        raise ConfigError(f"no search space: {DEFAULT_SPACE} is missing; give --config <file>.yaml")
    return (spaces[0] if spaces else DEFAULT_SPACE), rest


def is_search_space(path: Path) -> bool:
    if not path.is_file():
        return False
    content = yaml.safe_load(path.read_text())
    return isinstance(content, dict) and any(key in content for key in SPACE_KEYS)


def read_space(path: Path) -> Any:
    """metric, direction, sampler and pruner (Optuna classes by class_path), params."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--metric", type=str, default="val/acc")
    parser.add_argument("--direction", type=Literal["maximize", "minimize"], default="maximize")
    parser.add_argument("--sampler", type=BaseSampler, default=lazy_instance(TPESampler, seed=0))
    parser.add_argument("--pruner", type=BasePruner, default=lazy_instance(MedianPruner))
    parser.add_argument("--params", type=dict[str, dict[str, Any]], default={})
    try:
        return parser.instantiate(parser.parse_path(path, defaults=True))
    except Exception as error:
        raise ConfigError(f"{path}: {one_line(error)} (keys: {', '.join(SPACE_KEYS)})") from error


def distribution(key: str, spec: dict[str, Any]) -> BaseDistribution:
    """The Optuna distribution of one `params` entry: a range or a list of choices."""
    accepted = "{low: L, high: H} with optional log: true or step: S, or {choices: [...]}"
    if set(spec) == {"choices"} and isinstance(spec["choices"], list) and spec["choices"]:
        if not all(isinstance(c, str | int | float | bool) for c in spec["choices"]):
            raise ConfigError(f"params.{key}.choices must be plain values, got {spec['choices']}")
        return CategoricalDistribution(spec["choices"])
    if not {"low", "high"} <= set(spec) <= {"low", "high", "log", "step"}:
        raise ConfigError(f"params.{key} must be {accepted}; got {spec}")
    bounds = (spec["low"], spec["high"], spec.get("step"))
    if any(isinstance(b, bool) or not isinstance(b, int | float | None) for b in bounds):
        raise ConfigError(f"params.{key}: low, high and step must be numbers, got {spec}")
    integer = all(isinstance(b, int | None) for b in bounds)
    kind = IntDistribution if integer else FloatDistribution
    step = spec.get("step", 1 if integer else None)
    try:
        return kind(spec["low"], spec["high"], log=bool(spec.get("log", False)), step=step)
    except ValueError as error:
        raise ConfigError(f"params.{key}: {error}") from error


def check_train_args(sweep: Sweep) -> None:
    """Parse the train.py flags with each value of each parameter, before any trial runs."""
    try:
        cli = ParseOnly(
            ImageClassifier,
            DataModule,
            args=sweep.train_args,
            run=False,
            parser_kwargs={"exit_on_error": False},
            seed_everything_default=False,
            save_config_callback=SaveRunConfig,
            auto_configure_optimizers=False,
        )
    except Exception as error:
        raise ConfigError(f"train.py flags: {one_line(error)}") from error
    for key, dist in sweep.space.items():
        categorical = isinstance(dist, CategoricalDistribution)
        for value in dist.choices if categorical else (dist.low, dist.high):
            try:
                cli.parser.parse_args([*sweep.train_args, *flags({key: value})])
            except Exception as error:
                raise ConfigError(
                    f"params.{key} = {value!r} is not a train.py option: {one_line(error)}"
                ) from error


def one_line(error: Exception) -> str:
    """jsonargparse's message, which spans several lines, on one."""
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip())


class ParseOnly(TrainCLI):
    """TrainCLI that stops after parsing: used to check arguments without building anything."""

    def instantiate_classes(self) -> None:
        pass


def flags(values: dict[str, Any]) -> list[str]:
    """Command-line flags for parameter values (strings as they are, the rest as JSON)."""
    return [
        arg
        for key, value in values.items()
        for arg in (f"--{key}", value if isinstance(value, str) else json.dumps(value))
    ]


def suggest(trial: Trial, key: str, dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(key, dist.choices)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(key, dist.low, dist.high, step=dist.step, log=dist.log)
    return trial.suggest_float(key, dist.low, dist.high, step=dist.step, log=dist.log)


def run_trial(trial: Trial, sweep: Sweep) -> PyTorchLightningPruningCallback:
    """Train with this trial's values into runs/sweeps/<study>/trial_<N>/; return the pruner."""
    values = {key: suggest(trial, key, dist) for key, dist in sweep.space.items()}
    args = [
        *sweep.train_args,
        "--trainer.logger.init_args.save_dir", str(sweep.folder),
        "--trainer.logger.init_args.name", f"trial_{trial.number:03d}",
        # The kept checkpoint, and the one tested, is the best by the sweep's metric.
        "--checkpoint.monitor", sweep.metric,
        "--checkpoint.mode", "max" if sweep.direction == "maximize" else "min",
        *flags(values),
    ]  # fmt: skip
    pruning = PyTorchLightningPruningCallback(trial, monitor=sweep.metric)
    with trial_environment(trial):
        try:
            main(args, callbacks=[pruning])
        except SystemExit as stop:
            # Optuna records exceptions only: a stop goes on as one, any other exit fails.
            if stopped_by_user(stop):
                raise KeyboardInterrupt from stop
            raise RuntimeError(f"train.py stopped: {stop.code}") from stop
    return pruning


def stopped_by_user(stop: SystemExit) -> bool:
    """Lightning ends fit with SystemExit on Ctrl-C (after a KeyboardInterrupt) and SIGTERM."""
    return isinstance(stop, SIGTERMException) or isinstance(stop.__context__, KeyboardInterrupt)


@contextlib.contextmanager
def trial_environment(trial: Trial) -> Iterator[None]:
    """Name the trial for the processes a DDP run starts; undo what the launcher sets.

    Lightning's launcher leaves MASTER_PORT, LOCAL_RANK, ... in this process's environment,
    which would make the next trial wait for processes nobody starts.
    """
    saved = dict(os.environ)
    os.environ[TRIAL_ENV] = str(trial._trial_id)  # Optuna's Trial(study, id) takes this id
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def objective(trial: Trial, sweep: Sweep) -> float:
    """The trial's best value of the metric over its validation epochs."""
    try:
        pruning = run_trial(trial, sweep)
    finally:
        runs = sorted((sweep.folder / f"trial_{trial.number:03d}").glob("version_*"))
        if runs:
            trial.set_user_attr("run_folder", str(runs[-1]))
    with warnings.catch_warnings():
        # Under DDP the values come back from every process's record; some are known already.
        warnings.filterwarnings("ignore", message="The reported value is ignored")
        pruning.check_pruned()
    (frozen,) = [t for t in trial.study.get_trials(deepcopy=False) if t.number == trial.number]
    values = list(frozen.intermediate_values.values())
    if not values:
        trial.study.stop()
        raise ConfigError(f"metric {sweep.metric!r} was never logged; check `metric` of the space")
    return max(values) if sweep.direction == "maximize" else min(values)


def join_trial(sweep: Sweep) -> None:
    """Run as one more process of the DDP trial that started this process."""
    study = optuna.load_study(study_name=sweep.name, storage=sweep.url)
    run_trial(Trial(study, int(os.environ[TRIAL_ENV])), sweep)


def finished(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def stop(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (kill) stops the sweep the way Ctrl-C does."""
    raise KeyboardInterrupt


def run(argv: list[str] | None = None) -> None:
    """Run the study until it has --n_trials finished trials, then report the best."""
    # The sweep passes each trial's flags to LightningCLI while its own are in sys.argv; it
    # relies on Optuna's heartbeats and plots, marked experimental since Optuna 2.
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter", category=UserWarning)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    try:
        sweep = parse(sys.argv[1:] if argv is None else argv)
        if TRIAL_ENV in os.environ:
            return join_trial(sweep)
        check_train_args(sweep)
    except ConfigError as error:
        sys.exit(f"error: {error}")
    sweep.folder.mkdir(parents=True, exist_ok=True)
    try:
        study = optuna.create_study(
            study_name=sweep.name,
            storage=sweep.storage(),
            sampler=sweep.sampler,
            pruner=sweep.pruner,
            direction=sweep.direction,
            load_if_exists=True,
        )
    except ValueError as error:
        sys.exit(f"error: study {sweep.name}: {error}")
    optuna.storages.fail_stale_trials(study)
    remaining = sweep.n_trials - finished(study)
    print(
        f"Study {sweep.name} in {sweep.folder}: {finished(study)} trial(s) finished, "
        f"{max(remaining, 0)} to run"
    )
    signal.signal(signal.SIGTERM, stop)
    try:
        if remaining > 0:
            study.optimize(lambda t: objective(t, sweep), n_trials=remaining, catch=(Exception,))
    except KeyboardInterrupt:
        interrupted = study.get_trials(deepcopy=False)[-1]
        if interrupted.state == TrialState.FAIL:
            RetryHeartbeatStaleTrialCallback(max_retry=1)(study, interrupted)
        sys.exit(
            f"Stopped. Trial {interrupted.number} is recorded as failed and runs again first "
            "when the same command continues the study."
        )
    report(study, sweep)


def report(study: optuna.Study, sweep: Sweep) -> None:
    """Print the best trial; write best.yaml and the plots into the study folder."""
    counts = {state.name.lower(): 0 for state in TrialState}
    for trial in study.get_trials(deepcopy=False):
        counts[trial.state.name.lower()] += 1
    print("Trials: " + ", ".join(f"{n} {state}" for state, n in counts.items() if n))
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        print("No trial has completed yet: no best config and no plots.")
        return
    best = study.best_trial
    print(f"Best trial: {best.number} with {sweep.metric} = {best.value:.4f}")
    for key, value in best.params.items():
        print(f"  --{key} {value}")
    write_best_config(best, sweep)
    save_plots(study, sweep.folder, complete)


def write_best_config(best: FrozenTrial, sweep: Sweep) -> None:
    config = Path(best.user_attrs["run_folder"]) / "config.yaml"
    path = sweep.folder / "best.yaml"
    path.write_text(
        f"# Trial {best.number} of study {sweep.name}: {sweep.metric} = {best.value:.4f}\n"
        f"# python train.py --config {path}   (add --max_epochs N to train longer)\n"
        + config.read_text()
    )
    print(f"Best config: {path}")


def save_plots(study: optuna.Study, folder: Path, complete: list[FrozenTrial]) -> None:
    """history.png, and importances.png when completed trials differ in their parameters."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no window
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as plots

    figures = {"history.png": plots.plot_optimization_history(study).figure}
    varied = any(len({repr(t.params.get(k)) for t in complete}) > 1 for k in study.best_params)
    if len(complete) >= 2 and varied:
        figures["importances.png"] = plots.plot_param_importances(study).figure
    else:
        print(
            "Parameter importances need two completed trials with different "
            "parameter values: importances.png not written yet."
        )
    for name, figure in figures.items():
        figure.savefig(folder / name, dpi=120, bbox_inches="tight")
        plt.close(figure)
    print(f"Plots: {', '.join(str(folder / name) for name in figures)}")
