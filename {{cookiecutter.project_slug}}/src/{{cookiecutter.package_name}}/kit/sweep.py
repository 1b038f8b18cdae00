"""Hyperparameter search with Optuna: each trial is a train.py run, the study a SQLite file.

python sweep.py --n_trials 20             the search space of configs/sweep/default.yaml
python sweep.py --config configs/sweep/default.yaml --max_epochs 5    train.py flags: every trial
python sweep.py --n_trials 20             again: continues the study where it stopped
"""

import gc
import json
import logging
import os
import signal
import statistics
import sys
import threading
import warnings
from pathlib import Path
from types import FrameType
from typing import Any

import optuna
import yaml
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    IntDistribution,
    check_distribution_compatibility,
)
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, Trial, TrialState
from optuna_integration import PyTorchLightningPruningCallback

from .callbacks import better
from .cli import configured_loggers
from .compat import trial_id
from .errors import ConfigError
from .guards import in_finalizer
from .repeat import RUN_ENV, Run, write_manifest
from .runs import environment, logger_in
from .search_space import Sweep, check_train_args, flags, parse
from .train import main

# Lightning's DDP launcher starts the other processes of a trial by running this same
# command again; this variable tells them which trial to join instead of starting one.
TRIAL_ENV = "SWEEP_TRIAL_ID"
# A trial whose process died without a word (kill -9, power cut) is failed, and retried
# once, when it has sent no heartbeat for GRACE_S seconds.
HEARTBEAT_S, GRACE_S = 10, 30
# Set by SIGTERM and Ctrl-C: whatever a trial raises after it, it was stopped, not failed.
STOP = threading.Event()


def run(argv: list[str] | None = None) -> None:
    """Run the study until it has --n_trials finished trials, then report the best."""
    # The sweep passes each trial's flags to LightningCLI while its own are in sys.argv; it
    # relies on Optuna's heartbeats and plots, marked experimental since Optuna 2.
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter", category=UserWarning)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    quiet_optuna()
    try:
        sweep = parse(sys.argv[1:] if argv is None else argv)
        check_train_args(sweep)
        if TRIAL_ENV in os.environ:
            return join_trial(sweep)
        study = open_study(sweep)
    except ConfigError as error:
        sys.exit(f"error: {error}")
    remaining = sweep.n_trials - finished(study)
    print(
        f"Study {sweep.name} in {sweep.folder}: {finished(study)} trial(s) finished, "
        f"{max(remaining, 0)} to run"
    )
    if sweep.repeat is not None:
        runs = ", ".join(run.name for run in sweep.repeat.runs())
        print(f"Each trial's value: the mean of {sweep.metric} over its runs {runs}")
    if remaining > 0:
        optimize(study, sweep, remaining)
    report(study, sweep)


def open_study(sweep: Sweep) -> optuna.Study:
    """Create the study, or load it and fail the trials of processes that died."""
    sweep.folder.mkdir(parents=True, exist_ok=True)
    storage = RDBStorage(
        sweep.url,
        heartbeat_interval=HEARTBEAT_S,
        grace_period=GRACE_S,
        heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1),
    )
    study = optuna.create_study(
        study_name=sweep.name,
        storage=storage,
        sampler=sweep.sampler,
        pruner=sweep.pruner,
        direction=sweep.direction,
        load_if_exists=True,
    )
    # Optuna keeps a loaded study's direction without a word; a changed goal is a new study.
    goal = f"{sweep.direction} {sweep.metric}"
    if study.user_attrs.get("goal", goal) != goal:
        raise ConfigError(
            f"study {sweep.name} is to {study.user_attrs['goal']}, not to {goal}; "
            "give --study NAME to start another"
        )
    study.set_user_attr("goal", goal)
    # Optuna samples a changed range from then on, but fails every trial of a parameter whose
    # choices (or kind) changed: that is refused here, before any trial.
    refused, changed = space_changes(study, sweep.space)
    if refused:
        raise ConfigError(
            f"study {sweep.name} drew from other choices: {refused}; a study cannot change a "
            "parameter's choices: give --study NAME to start another, or search the choices it "
            "was searched with"
        )
    if changed:
        print(f"note: the search space changed since the study's earlier trials: {changed}")
    optuna.storages.fail_stale_trials(study)
    if trials := len(study.get_trials(deepcopy=False)):
        study.sampler = sweep.sampler_after(trials)
    return study


def space_changes(study: optuna.Study, space: dict[str, BaseDistribution]) -> tuple[str, str]:
    """How `space` differs from the space the study's trials drew from: (what Optuna cannot
    take, what it can), each in words; empty where nothing differs."""
    before: dict[str, BaseDistribution] = {}
    for trial in study.get_trials(deepcopy=False):
        before.update(trial.distributions)
    refused: list[str] = []
    changed: list[str] = []
    if not before:  # a new study, or one whose trials never drew a value
        return "", ""
    for key in sorted(before.keys() | space.keys()):
        old, new = before.get(key), space.get(key)
        if old == new:
            continue
        words = f"{key} {in_words(old)} then, {in_words(new)} now"
        try:
            if old is not None and new is not None:
                check_distribution_compatibility(old, new)
            changed.append(words)
        except ValueError:
            refused.append(words)
    return ", ".join(refused), ", ".join(changed)


def in_words(dist: BaseDistribution | None) -> str:
    if dist is None:
        return "not searched"
    if isinstance(dist, CategoricalDistribution):
        return f"choices {list(dist.choices)}"
    scale = " log" if getattr(dist, "log", False) else ""
    step = f" step {dist.step}" if getattr(dist, "step", None) not in (None, 1) else ""
    return f"{dist.low} to {dist.high}{scale}{step}"


def optimize(study: optuna.Study, sweep: Sweep, n_trials: int) -> None:
    """Run trials one at a time; on Ctrl-C or SIGTERM queue the stopped trial again and exit."""
    STOP.clear()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        study.optimize(
            lambda t: objective(t, sweep),
            n_trials=n_trials,
            catch=(Exception,),
            callbacks=[lambda study, trial: after_trial(study, trial, sweep)],
        )
    except KeyboardInterrupt:
        last = study.get_trials(deepcopy=False)[-1]
        if last.state != TrialState.FAIL:
            sys.exit("Stopped between two trials; the same command continues the study.")
        RetryHeartbeatStaleTrialCallback()(study, last)
        sys.exit(
            f"Stopped. Trial {last.number} is recorded as failed and runs again first "
            "when the same command continues the study."
        )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def objective(trial: Trial, sweep: Sweep) -> float:
    """The trial's best value of the metric over its validation epochs (or, with a repeat in
    the search space, the mean over its runs of each run's best)."""
    if sweep.repeat is not None:
        return repeated_objective(trial, sweep)
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
        trial.study.stop()  # every trial would miss it
        raise RuntimeError(f"the trial never logged {sweep.metric!r}, the search space's metric")
    return max(values) if sweep.direction == "maximize" else min(values)


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
        "--trainer.logger",
        logger_in(sweep.folder, f"trial_{trial.number:03d}", configured_loggers(sweep.train_args)),
        *flags(values),
    ]  # fmt: skip
    pruning = PyTorchLightningPruningCallback(trial, monitor=sweep.metric)
    train_trial(trial, args, [pruning])
    return pruning


def repeated_objective(trial: Trial, sweep: Sweep) -> float:
    """The mean over the trial's seeds or folds of the metric's best value in each run.

    After each run, the running mean is the trial's value at step k (k + 1 runs done): the
    pruner compares trials after the same number of runs and can stop one between runs.
    """
    # The trial's runs make one row of results.py's table; --compare pairs two trials by run.
    folder = sweep.folder / f"trial_{trial.number:03d}"
    write_manifest(folder, trial_flags(trial, sweep), sweep.repeat.folds)
    best: list[float] = []
    for step, run in enumerate(sweep.repeat.runs()):
        record = BestValue(sweep.metric, sweep.direction)
        try:
            with environment(RUN_ENV, run.name):
                train_trial(trial, repeated_args(trial, sweep, run), [record])
        finally:
            if step == 0 and (runs := sorted((folder / run.name).glob("version_*"))):
                trial.set_user_attr("run_folder", str(runs[-1]))
        if record.best is None:
            trial.study.stop()  # every trial would miss it
            raise RuntimeError(f"the trial never logged {sweep.metric!r}, the space's metric")
        best.append(record.best)
        trial.set_user_attr("runs", {**trial.user_attrs.get("runs", {}), run.name: record.best})
        trial.report(statistics.fmean(best), step)
        if trial.should_prune():
            raise optuna.TrialPruned(f"pruned after {step + 1} run(s)")
    return statistics.fmean(best)


def trial_flags(trial: Trial, sweep: Sweep) -> list[str]:
    """train.py's flags for every run of a trial: the sweep's and the trial's values."""
    values = {key: suggest(trial, key, dist) for key, dist in sweep.space.items()}
    return [*sweep.train_args, *flags(values)]


def repeated_args(trial: Trial, sweep: Sweep, run: Run) -> list[str]:
    """train.py's flags for one run of a repeated trial: trial_<N>/<seed or fold>/."""
    folder = sweep.folder / f"trial_{trial.number:03d}"
    loggers = configured_loggers(sweep.train_args)
    logger = ["--trainer.logger", logger_in(folder, run.name, loggers)]
    return [*trial_flags(trial, sweep), *logger, *run.flags(sweep.repeat.folds)]


class BestValue(Callback):
    """The best value of one validation metric over a run's epochs."""

    def __init__(self, metric: str, direction: str) -> None:
        self.metric, self.mode = metric, "max" if direction == "maximize" else "min"
        self.best: float | None = None

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        value = trainer.callback_metrics.get(self.metric)
        if trainer.sanity_checking or value is None:
            return
        if self.best is None or better(float(value), self.best, self.mode):
            self.best = float(value)


def train_trial(trial: Trial, args: list[str], callbacks: list[Callback]) -> None:
    """One train.py run of the trial; a stop by the user goes on as KeyboardInterrupt, any
    other exit as an error (Optuna records exceptions only)."""
    with environment(TRIAL_ENV, str(trial_id(trial))):
        try:
            stopped_meanwhile()
            main(args, callbacks=[*callbacks, StopWhenAsked()])
            stopped_meanwhile()
        except SystemExit as stop:
            if stopped_by_user(stop) or STOP.is_set():
                raise KeyboardInterrupt from stop
            raise TrialRefusedError(f"train.py stopped: {stop.code}") from stop
        except ConfigError as error:  # a value refused as the run set up (in this process)
            raise TrialRefusedError(f"train.py stopped: error: {error}") from error
        except Exception as error:
            if STOP.is_set():  # e.g. a collective that the signal broke off
                raise KeyboardInterrupt from error
            raise


class TrialRefusedError(RuntimeError):
    """A trial that train.py stopped with its own message (a value it refused): the failed
    trial's line says it, without a traceback."""


def stopped_meanwhile() -> None:
    """A stop that `stop` could not raise where the signal came stops the sweep here, this
    trial queued again."""
    if STOP.is_set():
        raise KeyboardInterrupt


class StopWhenAsked(Callback):
    """Stops the trial at its next batch once the sweep was asked to stop, as Ctrl-C there
    would: a signal that came while a finalizer ran could not raise (see `stop`)."""

    def on_train_batch_start(self, *_: Any) -> None:
        stopped_meanwhile()

    def on_validation_batch_start(self, *_: Any) -> None:
        stopped_meanwhile()


def stopped_by_user(stop: SystemExit) -> bool:
    """Lightning ends fit with SystemExit on Ctrl-C (after a KeyboardInterrupt) and SIGTERM."""
    return isinstance(stop, SIGTERMException) or isinstance(stop.__context__, KeyboardInterrupt)


def join_trial(sweep: Sweep) -> None:
    """Run as one more process of the DDP trial that started this process."""
    study = optuna.load_study(study_name=sweep.name, storage=sweep.url)
    trial = Trial(study, int(os.environ[TRIAL_ENV]))
    if sweep.repeat is None:
        run_trial(trial, sweep)
        return
    (run,) = [r for r in sweep.repeat.runs() if r.name == os.environ[RUN_ENV]]
    train_trial(trial, repeated_args(trial, sweep, run), [BestValue(sweep.metric, sweep.direction)])


def finished(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def stop(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (kill) stops the sweep the way Ctrl-C does; both mark the trial as stopped.

    Python runs a signal handler wherever the main thread is, also in a finalizer (a loader
    shutting down its workers as the previous trial is collected, say); an exception raised
    there is printed with its traceback and lost. There the handler only marks the stop,
    which the trial's next batch (`StopWhenAsked`) or its end turns into the KeyboardInterrupt.
    """
    STOP.set()
    if not in_finalizer(frame):
        raise KeyboardInterrupt


def quiet_optuna() -> None:
    """Optuna's warnings (a crashed trial and its traceback), not its progress lines.

    Its lines for finished trials print values with every float digit (after_trial prints
    them with four), and a trial stopped by the user is not a crash: the sweep says so in
    one line instead of Optuna's traceback.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.logging.disable_default_handler()
    root = logging.getLogger("optuna")
    if OPTUNA_HANDLER not in root.handlers:
        root.addHandler(OPTUNA_HANDLER)


OPTUNA_HANDLER = logging.StreamHandler()
OPTUNA_HANDLER.setFormatter(logging.Formatter("[%(levelname).1s %(asctime)s] %(message)s"))
OPTUNA_HANDLER.addFilter(lambda record: not STOP.is_set() and without_traceback(record))


def without_traceback(record: logging.LogRecord) -> bool:
    """Optuna's line about a trial that train.py refused, without the traceback it adds."""
    if record.exc_info and isinstance(record.exc_info[1], TrialRefusedError):
        record.exc_info = record.exc_text = None  # the text, if a handler before made it
    return True


def after_trial(study: optuna.Study, trial: FrozenTrial, sweep: Sweep) -> None:
    """Free the trial's loaders and worker processes, then print one line about it.

    A trial that raised (pruned, failed) leaves its loaders in a reference cycle through the
    traceback. Collected later, possibly inside a worker process forked by the next trial,
    they would try to stop workers that are not that process's children, and print
    tracebacks; collected here, they stop their workers at once.
    """
    gc.collect()
    if trial.state == TrialState.COMPLETE:
        best = study.best_trial
        print(
            f"Trial {trial.number} finished: {sweep.metric} {trial.value:.4f} "
            f"(best: trial {best.number}, {best.value:.4f})"
        )
    elif trial.state == TrialState.PRUNED:
        steps = len(trial.intermediate_values)
        unit = "run" if sweep.repeat else "validation"
        print(f"Trial {trial.number} pruned after {steps} {unit}(s)")


def report(study: optuna.Study, sweep: Sweep) -> None:
    """Print the best trial; write best.yaml and the plots into the study folder."""
    counts = {state.name.lower(): 0 for state in TrialState}
    for trial in study.get_trials(deepcopy=False):
        counts[trial.state.name.lower()] += 1
    print("Trials: " + ", ".join(f"{n} {state}" for state, n in counts.items() if n))
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        if counts["fail"] == sum(counts.values()):  # a failed search, for a script too
            sys.exit("Every trial failed: no best config and no plots.")
        print("No trial has completed yet: no best config and no plots.")
        return
    best = study.best_trial
    print(f"Best trial: {best.number} with {sweep.metric} = {best.value:.4f}")
    for key, value in best.params.items():
        print(f"  --{key} {value}")
    write_best_config(best, sweep)
    save_plots(study, sweep.folder, complete)


def write_best_config(best: FrozenTrial, sweep: Sweep) -> None:
    """The best trial's config.yaml, with the loggers train.py's flags give: trained again, it
    is a run of its own among train.py's (runs/default/), not one more run of the trial."""
    config = yaml.safe_load((Path(best.user_attrs["run_folder"]) / "config.yaml").read_text())
    loggers = configured_loggers(sweep.train_args)
    first = loggers[0]["init_args"]
    config["trainer"]["logger"] = json.loads(
        logger_in(Path(first["save_dir"]), first["name"], loggers)  # no run id or version
    )
    path = sweep.folder / "best.yaml"
    each = "# The value is the mean over the trial's runs; below, its first run's config.\n"
    path.write_text(
        f"# Trial {best.number} of study {sweep.name}: {sweep.metric} = {best.value:.4f}\n"
        + (each if sweep.repeat is not None else "")
        + f"# python train.py --config {path}   (add --max_epochs N to train longer)\n"
        + yaml.safe_dump(config, sort_keys=False)
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
        with warnings.catch_warnings():
            # Optuna's warning when every completed trial has the same result; said below.
            warnings.filterwarnings("ignore", message="Target and region quantiles")
            # Its estimator's, while a parameter has few trials: the importances are rough
            # then, which a study of a few trials is anyway.
            warnings.filterwarnings("ignore", message="Some regimes for parameter")
            figures["importances.png"] = plots.plot_param_importances(study).figure
        if len({t.value for t in complete}) == 1:
            print("Every completed trial has the same result so far: the importances are equal.")
    else:
        print(
            "Parameter importances need two completed trials with different "
            "parameter values: importances.png not written yet."
        )
    for name, figure in figures.items():
        figure.savefig(folder / name, dpi=120, bbox_inches="tight")
        plt.close(figure)
    print(f"Plots: {', '.join(str(folder / name) for name in figures)}")
