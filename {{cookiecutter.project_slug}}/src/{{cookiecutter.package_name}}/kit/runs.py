"""Run folders, resume, signals and process teardown: what happens around fit and test.

The recipe (train.py) calls these; each turns a situation a user meets (a resume, a
preemption, a diverged loss, processes out of step) into one line and an exit code.
"""

import contextlib
import copy
import json
import logging
import os
import re
import signal
import sys
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import torch
from lightning import LightningModule, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torchmetrics import MetricCollection

from .checkpoint import layer_differences, load_checkpoint, load_weights, resolve_checkpoint
from .compat import destroy_process_group, tensorboard_file_writer
from .errors import ConfigError, DivergedError
from .guards import INTERRUPTED, SaveOnPreemption, handle_interrupts
from .records import DIRECTIONS, flatten

# Loggers whose save_dir/name/version_<N> folder is the run folder, when first in the list.
FOLDER_LOGGERS = ("TensorBoardLogger", "CSVLogger")


def quiet_known_noise() -> None:
    """Silence third-party messages that say nothing about this project's runs."""
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
    # torchdata's StatefulDataLoader calls a deprecated torch telemetry hook.
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
    # jsonargparse deprecations triggered inside Lightning's own CLI code.
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="lightning.pytorch.cli")
    # Lightning, when an epoch has fewer batches than log_every_n_steps: the step logs still
    # come every N steps, counted across epochs, and every epoch logs its own means.
    warnings.filterwarnings("ignore", message="The number of training batches .* is smaller")
    # Lightning, at the final test of a multi-process run: its DistributedSampler pads the
    # test split to a multiple of the process count (README, Scaling out, says so and how to
    # get exact figures: python evaluate.py --devices 1).
    warnings.filterwarnings("ignore", message="Using `DistributedSampler` with the dataloaders")
    # Lightning's EMA callback, testing a checkpoint (train.py's test, evaluate.py): the
    # checkpoint's weights are the average, which the test is meant to use.
    warnings.filterwarnings("ignore", message="You're using the WeightAveraging callback, but")
    # Lightning's model summary estimates the size in MB from 32-bit weights under bf16-mixed.
    warnings.filterwarnings("ignore", message="Precision .* is not supported by the model summary")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: not record.getMessage().startswith("💡 Tip")
    )


# At import too: the processes ddp_spawn starts import this module (for SaveRunConfig) but
# never run the recipe.
quiet_known_noise()


def first_logger(config: object) -> object:
    """The first logger of a parsed config: its save_dir/name/version_<N> is the run folder."""
    logger = config.trainer.logger
    return logger[0] if isinstance(logger, list) and logger else logger


def logger_in(folder: Path, name: str, loggers: list[dict[str, Any]]) -> str:
    """`loggers` (cli.configured_loggers), the first writing its run folders to folder/name, as
    JSON (a --trainer.logger value): the runs of a search or a repeat go into a folder of their
    own."""
    loggers = copy.deepcopy(loggers)
    loggers[0]["init_args"] = {**loggers[0]["init_args"], "save_dir": str(folder), "name": name}
    for logger in loggers:  # a run of its own each: no version or run id of the config's
        for key in ("version", "id", "run_id"):
            if logger.get("init_args", {}).get(key) is not None:
                logger["init_args"][key] = None
    return json.dumps(loggers if len(loggers) > 1 else loggers[0])  # one: as configured


@contextlib.contextmanager
def environment(name: str, value: str) -> Iterator[None]:
    """Set `name` for the processes a DDP run starts (they run this same command again, and
    the variable tells them which run to join); undo what Lightning's launcher sets.

    The launcher leaves MASTER_PORT, LOCAL_RANK, ... in this process's environment, which
    would make the next run of a search or a repeat wait for processes nobody starts.
    """
    saved = dict(os.environ)
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def resume_checkpoint(ckpt_path: str, logger: object) -> Path:
    """The file that --ckpt_path names: 'last' is the newest run of the logger's experiment."""
    if ckpt_path == "last":
        if not getattr(logger, "class_path", "").endswith(FOLDER_LOGGERS):
            raise ConfigError(
                "--ckpt_path last needs a TensorBoardLogger or CSVLogger (first) to find "
                "the run folders; give a file path"
            )
        return resolve_checkpoint("last", Path(logger.init_args.save_dir) / logger.init_args.name)
    if Path(ckpt_path).is_file():
        return Path(ckpt_path)
    raise ConfigError(f"ckpt_path {ckpt_path!r} is not a file; give a checkpoint file or 'last'")


def log_into_resumed_run(logger: object, checkpoint: Path) -> None:
    """Point the first logger at the folder of the run that wrote `checkpoint`."""
    if getattr(logger, "class_path", "").endswith(FOLDER_LOGGERS) and (
        checkpoint.parent.name == "checkpoints"
    ):
        run = checkpoint.parent.parent
        logger.init_args.save_dir = str(run.parent.parent)
        logger.init_args.name = run.parent.name
        logger.init_args.version = run.name


class SaveRunConfig(SaveConfigCallback):
    """Writes config.yaml into a new run folder, and again when the run is resumed: then it is
    the run's own config with the flags given on top (a higher --max_epochs, say), what the run
    went on with, which results.py shows and a later resume starts from. Testing a run
    (evaluate.py) leaves it as it is.

    The saved config has no ckpt_path, so `--config config.yaml` repeats the run.
    """

    def __init__(self, parser: LightningArgumentParser, config, **kwargs) -> None:
        config = config.clone()
        config.ckpt_path = None
        super().__init__(parser, config, **kwargs)

    def setup(self, trainer, pl_module, stage: str) -> None:
        log_dir = trainer.log_dir  # a collective call: every rank must make it
        exists = trainer.is_global_zero and Path(log_dir, self.config_filename).exists()
        if trainer.strategy.broadcast(exists) and stage != "fit":
            self.already_saved = True
        super().setup(trainer, pl_module, stage)


def check_resumable(model: torch.nn.Module, path: Path) -> None:
    """Refuse a checkpoint that is unsafe, damaged or cannot go on under this configuration;
    load its weights into `model` otherwise.

    Resuming restores the optimizer's and the schedule's state and the weights: another
    optimizer or schedule class, other layer shapes or another input shape or class count
    cannot take them. One line names each difference and the commands that work.
    """
    checkpoint = load_checkpoint(path)
    if "state_dict" not in checkpoint or "loops" not in checkpoint:
        raise ConfigError(f"{path} is not a Lightning training checkpoint (nothing to resume)")
    saved, now = checkpoint.get("hyper_parameters", {}), dict(model.hparams)
    changes = [
        f"model.{key} {class_of(saved.get(key))} (now {class_of(now.get(key))})"
        for key in ("optimizer", "scheduler", "backbone")
        if class_of(saved.get(key)) != class_of(now.get(key))
    ]
    groups = [len(state["param_groups"]) for state in checkpoint.get("optimizer_states", [])]
    grouping = getattr(model, "parameter_groups", None)  # optional in the contract
    if groups and callable(grouping) and groups[0] != (wanted := len(grouping())):
        changes.append(f"{groups[0]} optimizer parameter group(s) (now {wanted})")
    for key, name in (("input_shape", "input shape"), ("num_classes", "class count")):
        was, wanted = saved.get(key), now.get(key)
        if was is not None and plain(was) != plain(wanted):
            changes.append(f"data {name} {plain(was)} (now {plain(wanted)})")
    state, expected = checkpoint["state_dict"], model.state_dict()
    if not changes and (differ := layer_differences(state, expected)):
        first = differ[0]
        more = f" and {len(differ) - 1} more" if len(differ) > 1 else ""
        changes.append(f"other layers ({first}{more})")
    if changes:
        raise ConfigError(
            f"{path} was trained with {'; '.join(changes)}, which cannot resume from it: "
            f"resume as it was configured (python train.py --ckpt_path {path}, plus flags "
            "that change none of these), or start a new run with the change (no --ckpt_path)"
        )
    load_weights(model, state, path)
    # ModelCheckpoint warns about any folder that holds checkpoints; this one should.
    folder = re.escape(str(path.parent))
    warnings.filterwarnings("ignore", message=f"Checkpoint directory {folder} exists")


def class_of(value: object) -> object:
    """The class path of a class_path/init_args dict, else the value itself."""
    return value.get("class_path") if isinstance(value, dict) else value


def plain(value: object) -> object:
    """A shape as a tuple, whether it was saved as a list or a tuple."""
    return tuple(value) if isinstance(value, list | tuple) else value


@contextlib.contextmanager
def stops_in_one_line(trainer: Trainer, collective_seconds: float) -> Iterator[None]:
    """Turn a divergence, a preemption signal or processes out of step into one line and an
    exit code; anything else goes on as it is. Ctrl-C stops the run wherever it comes
    (`guards.interrupt`; check `stop_if_interrupted` between fit and test)."""
    if not SLURMEnvironment.detect():
        # Outside SLURM (which requeues on SIGUSR1 itself), SIGUSR1 means "save and stop" too.
        signal.signal(signal.SIGUSR1, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    handling = handle_interrupts()
    try:
        yield
    except ConfigError as error:  # found while reading the data
        sys.exit(f"error: {error}")
    except DivergedError as error:
        saved = [Path(c.best_model_path) for c in trainer.checkpoint_callbacks if c.best_model_path]
        newest = max(saved, key=lambda p: p.stat().st_mtime, default=None)
        kept = f"last good checkpoint: {newest}" if newest else "no checkpoint was written"
        sys.exit(f"error: training diverged: {error}; {kept}")
    except SIGTERMException:
        stopped_by_signal(trainer)
    except RuntimeError as error:
        if trainer.received_sigterm:  # a loader worker that the same signal ended first
            stopped_by_signal(trainer)
        if (timeout := collective_timeout(error)) is None:
            raise
        sys.exit(out_of_step(trainer, timeout, collective_seconds))
    finally:
        if handling:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def stop_if_interrupted(trainer: Trainer) -> None:
    """End the run as Lightning ends one that Ctrl-C stopped (exit status 1) if Ctrl-C came
    where it could not raise (in a finalizer as fit or test ended)."""
    if INTERRUPTED.is_set():
        rank_zero_info(f"Detected KeyboardInterrupt at step {trainer.global_step}, stopping")
        sys.exit(1)


def stopped_by_signal(trainer: Trainer) -> NoReturn:
    """Say where a run that SIGTERM stopped was saved, and exit as a process it ended would."""
    saved = next((c.saved for c in trainer.callbacks if isinstance(c, SaveOnPreemption)), None)
    if trainer.is_global_zero:
        print(f"Stopped by a signal at step {trainer.global_step}; saved {saved}.")
        if saved is not None:
            print(f"Resume with: python train.py --ckpt_path {saved}")
    sys.exit(128 + signal.SIGTERM)


def collective_timeout(error: BaseException | None) -> BaseException | None:
    """The first torch.distributed timeout that led to `error`, or None if none did.

    gloo raises "Timed out waiting ..." in the process, and "Application timeout caused pair
    closure" in a collective that follows it (Lightning's SIGTERM handler makes one); NCCL's
    watchdog ends the process itself with a message naming the rank and the collective.
    """
    first = None
    while error is not None:
        message = str(error).lower()
        if "timed out" in message or "timeout" in message:
            first = error
        error = error.__context__
    return first


def out_of_step(trainer: Trainer, timeout: BaseException, seconds: float) -> str:
    """The one-line error of a process that gave up waiting in a collective."""
    frames = traceback.extract_tb(timeout.__traceback__)
    calls = [f.name for f in frames if f.filename.endswith("distributed_c10d.py")]
    # Where this process waited, for the log; each other process prints its own.
    print(f"Stack of rank {trainer.global_rank} when it gave up waiting:", file=sys.stderr)
    traceback.print_list(frames, file=sys.stderr)
    return (
        f"error: rank {trainer.global_rank} of {trainer.world_size} waited {seconds:g} s in "
        f"torch.distributed.{calls[-1] if calls else 'a collective'} for the other processes, "
        "which ran something else or stopped: the processes are out of step (its stack is "
        "above). --collective_timeout sets the wait"
    )


def best_checkpoint(trainer: Trainer) -> str | None:
    """The best checkpoint by the monitored metric, or None (test the weights as they are)."""
    checkpoint = trainer.checkpoint_callback
    return (checkpoint.best_model_path or None) if checkpoint else None


def metric_directions(model: LightningModule) -> dict[str, str]:
    """Which way each validation metric the model logs is better ("min" or "max"): val/loss,
    lower, and each metric of the model's collections prefixed val/, by torchmetrics'
    higher_is_better (a metric without a direction is left out: it cannot be monitored)."""
    found = {"val/loss": "min"}
    for module in model.modules():
        if isinstance(module, MetricCollection) and module.prefix == "val/":
            for name, metric in module.items(keep_base=False):
                if metric.higher_is_better is not None:
                    found[name] = "max" if metric.higher_is_better else "min"
    return found


def write_results(
    trainer: Trainer, checkpoint: str | None, metrics: dict[str, float], loggers: object = None
) -> None:
    """test_metrics.json and metric_directions.json (read by results.py) in the run folder, and
    the summary of the run on the console."""
    log_dir = trainer.log_dir  # a collective call: every rank must make it
    if trainer.is_global_zero and log_dir:
        path = Path(log_dir) / "test_metrics.json"
        path.write_text(json.dumps({"checkpoint": checkpoint or "", **metrics}, indent=2) + "\n")
        directions = metric_directions(trainer.lightning_module)
        (Path(log_dir) / DIRECTIONS).write_text(json.dumps(directions, indent=2) + "\n")
        print(summary(trainer, metrics, log_dir, loggers))


# The keys of a run's config that go to each logger's hyperparameter view.
HYPERPARAMETERS = re.compile(
    r"^(seed_everything|monitor|init_from|model\..*|data\..*"
    r"|trainer\.(max_epochs|precision|accumulate_grad_batches|gradient_clip_val|devices|num_nodes))$"
)


def log_hyperparameters(trainer: Trainer, config: object, metrics: dict[str, float]) -> None:
    """The run's hyperparameters, with its test metrics, in each logger's hyperparameter view
    (TensorBoard's HParams tab, MLflow's params, W&B's config): runs compare there too.

    Every logger has the test metrics already, logged by the test; TensorBoard's tab lists
    those, named with the hyperparameters, and they are not written a second time (Lightning's
    `log_hyperparams` would, at step 0: a test metric's chart would then run from step 0).
    """
    config = config.as_dict() if hasattr(config, "as_dict") else dict(config)
    params = {k: loggable(v) for k, v in flatten(config).items() if HYPERPARAMETERS.match(k)}
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            tensorboard_hparams(logger, params, metrics)
        else:
            logger.log_hyperparams(params)


@rank_zero_only
def tensorboard_hparams(
    logger: TensorBoardLogger, params: dict[str, Any], metrics: dict[str, float]
) -> None:
    """The HParams tab's summaries in the run's event files: the hyperparameters (None as
    "None", as Lightning writes it) and the names of the metrics beside them; hparams.yaml."""
    logger.hparams.update(params)
    if metrics:
        # Imported here: only a render that logs to TensorBoard installs it.
        from torch.utils.tensorboard.summary import hparams

        shown = {key: "None" if value is None else value for key, value in params.items()}
        # The test's end closed the writer; this reopens it, with a background thread that
        # writes later (or never): it is written out and closed below.
        writer = tensorboard_file_writer(logger.experiment)
        for summary in hparams(shown, metrics):
            writer.add_summary(summary)
    logger.finalize("success")  # closes the writer and saves hparams.yaml


def loggable(value: object) -> str | int | float | bool | None:
    """A value every logger stores as it is: a number, a string, a bool; others as JSON."""
    if isinstance(value, bool | None):
        return value
    # As the built-in type: W&B stores a subclass (jsonargparse's PositiveInt) as text.
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, default=str)
    return str(value)  # a path, say


def summary(
    trainer: Trainer, metrics: dict[str, float], log_dir: str, loggers: object = None
) -> str:
    """What a run leaves behind, and the commands that go on from it."""
    checkpoint = trainer.checkpoint_callback
    best = "none"
    if checkpoint is not None and checkpoint.best_model_path:
        best = checkpoint.best_model_path
        if (score := best_score(checkpoint)) is not None:
            best += f"  ({checkpoint.monitor} {score:.4f})"
    tested = "  ".join(f"{key} {value:.4f}" for key, value in sorted(metrics.items()))
    # What the run left: a run that trained no step (--max_epochs 0) has no checkpoints.
    kept = ["config.yaml", "checkpoints/", "plots/", "test_metrics.json"]
    kept = [name for name in kept if Path(log_dir, name).exists()]
    rows = {
        "Best checkpoint": best,
        "Test": tested or "not run",
        "Run folder": f"{log_dir}  ({', '.join(kept)})" if kept else log_dir,
        "Watch": how_to_watch(log_dir, loggers),
    }
    if (last := Path(log_dir, "checkpoints", "last.ckpt")).exists():
        rows["Resume"] = f"python train.py --ckpt_path {last} --max_epochs <more>"
    return "\n".join(f"{name + ':':<17}{value}" for name, value in rows.items())


def best_score(checkpoint: Any) -> float | None:
    """The best checkpoint's score: the callback's, or the one the checkpoint file holds where
    the callback has only the path (ddp_spawn hands the path back to this process, not the
    score). None without a monitored metric."""
    if checkpoint.best_model_score is not None:
        return float(checkpoint.best_model_score)
    if checkpoint.monitor is None:
        return None
    state = load_checkpoint(checkpoint.best_model_path)
    score = state.get("callbacks", {}).get(checkpoint.state_key, {}).get("best_model_score")
    return None if score is None else float(score)


def how_to_watch(log_dir: str, loggers: object) -> str:
    """Where the logged metrics of a run are, or the command that shows them, by the config's
    loggers (--trainer.logger: one or a list of class_path and init_args)."""
    loggers = loggers if isinstance(loggers, list) else [loggers]
    found = {getattr(logger, "class_path", "").rpartition(".")[2]: logger for logger in loggers}
    if logger := found.get("WandbLogger"):
        return f"wandb sync {logger.init_args.save_dir}/wandb/offline-run-*"
    if logger := found.get("MLFlowLogger"):
        uri = logger.init_args.tracking_uri
        return f"mlflow ui --backend-store-uri {uri}  (the UI needs the full mlflow package)"
    if logger := found.get("TensorBoardLogger"):
        return f"tensorboard --logdir {logger.init_args.save_dir}"
    return f"{log_dir}/metrics.csv (curves in {log_dir}/plots/)"


def finish() -> None:
    """End what outlives a run in this process: a W&B run, the process group."""
    wandb = sys.modules.get("wandb")  # imported only if a WandbLogger was used
    if wandb is not None and wandb.run is not None:
        wandb.run.finish()  # otherwise the next run in this process would log into it
    if torch.distributed.is_initialized():
        # Shut the process group down cleanly; left to interpreter exit, gloo can abort.
        destroy_process_group()


def release(cli: LightningCLI) -> None:
    """Let go of what the CLI built, so its loaders and their worker processes end with the run.

    The CLI object outlives the run (jsonargparse's parser context refers to it); without
    this, a process's next run would begin while the previous run's workers still ran.
    """
    cli.trainer = cli.model = cli.datamodule = cli.config_init = None
    cli.trainer_defaults = {}
