"""The command line: LightningCLI with short flags, argument links and one folder per run.

python train.py                                   fit, then test the best checkpoint
python train.py --devices 2 --max_epochs 5        short forms of --trainer.*
python train.py --config configs/resnet18.yaml    any --trainer.*, --model.*, --data.* key
python train.py --ckpt_path last                  resume the newest run of this experiment
"""

import contextlib
import importlib
import json
import logging
import os
import re
import signal
import sys
import traceback
import warnings
from argparse import SUPPRESS
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import torch
from jsonargparse.typing import PositiveFloat
from lightning import Trainer
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import (
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    ProgressBar,
    ThroughputMonitor,
    TQDMProgressBar,
)
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException
from torch import Tensor

from .callbacks import BatchSizeReport, EpochLine, SyncEpochMetrics, samples_in
from .checkpoint import load_checkpoint, load_weights, resolve_checkpoint, run_config
from .compat import set_collective_timeout
from .data import DataModule
from .datamodule import ConfigError
from .guards import DivergedError, RngState, SaveOnPreemption, StopOnDivergence
from .loggers import LOGGER, how_to_watch
from .model import ImageClassifier
from .plots import ConfusionMatrixPlot, TrainingCurves

# A kill loses at most this many optimizer steps (plus the epoch-end checkpoints).
CHECKPOINT_EVERY_N_STEPS = 100
# Seconds one process waits for the others in a collective before the run stops with an error.
# Long enough for rank 0 to download a dataset while the others wait; torch's own default is
# 30 minutes, so a run whose processes fell out of step would seem to hang.
COLLECTIVE_TIMEOUT = 600.0
# Loggers whose save_dir/name/version_<N> folder is the run folder, when first in the list.
FOLDER_LOGGERS = ("TensorBoardLogger", "CSVLogger")
SHORT_FLAGS = ("accelerator", "devices", "num_nodes", "precision", "strategy", "max_epochs")
DEFAULT_MAX_EPOCHS = {{ {"digits": 30, "mnist": 10, "fashion_mnist": 20, "cifar10": 40, "image_folder": 30}[cookiecutter.dataset] }}


class TrainCLI(LightningCLI):
    """Adds short flags, argument links, default callbacks and run-folder resume."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--ckpt_path",
            type=str | None,
            default=None,
            help="Resume from this checkpoint file, or 'last': the newest run of this experiment.",
        )
        parser.add_argument(
            "--collective_timeout",
            type=PositiveFloat,
            default=COLLECTIVE_TIMEOUT,
            help="Seconds a process waits for the others in one collective (several devices) "
            "before the run stops with an error naming it.",
        )
        for flag in SHORT_FLAGS:
            (action,) = [a for a in parser._actions if a.dest == f"trainer.{flag}"]
            # A suppressed default keeps the Trainer's own default unless the flag is given.
            parser.add_argument(
                f"--{flag}",
                dest=f"trainer.{flag}",
                type=action._typehint,
                default=SUPPRESS,
                help=f"Short for --trainer.{flag}.",
            )
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.input_shape", "model.input_shape", apply_on="instantiate")

        # The best checkpoint by val/loss, and the newest state for resuming in last.ckpt
        # (ModelCheckpoint's own save_last only refreshes when the best improves). Lightning
        # takes either an epoch or a step interval per callback, so two refresh last.ckpt:
        # one after every validation, one every N steps (a kill loses at most N steps).
        # val/loss, not val/acc: accuracy on a small validation split saturates (the digits
        # reach 1.0 within a few epochs) and would freeze the choice at the first such epoch.
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_lightning_class_args(ModelCheckpoint, "last_checkpoint")
        parser.add_lightning_class_args(ModelCheckpoint, "step_checkpoint")
        parser.add_lightning_class_args(EarlyStopping, "early_stopping")
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.add_lightning_class_args(TrainingCurves, "curves")
        parser.add_lightning_class_args(ConfusionMatrixPlot, "confusion_matrix")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val/loss",
                "checkpoint.mode": "min",
                "checkpoint.filename": "epoch{epoch:03d}-val_loss{val/loss:.4f}",
                "checkpoint.auto_insert_metric_name": False,
                "last_checkpoint.filename": "last",
                "last_checkpoint.enable_version_counter": False,
                "step_checkpoint.filename": "last",
                "step_checkpoint.enable_version_counter": False,
                "step_checkpoint.every_n_train_steps": CHECKPOINT_EVERY_N_STEPS,
                "early_stopping.monitor": "val/loss",
                "early_stopping.patience": 10,
                # val/loss exists only after validation; check there, not at train epoch end.
                "early_stopping.check_on_train_epoch_end": False,
                "lr_monitor.logging_interval": "step",
                "trainer.max_epochs": DEFAULT_MAX_EPOCHS,
                "trainer.log_every_n_steps": 10,
                "trainer.logger": LOGGER,
            }
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: object) -> None:
        """Parse; resuming a run folder's checkpoint puts the run's own config.yaml first.

        The run goes on as it was configured (optimizer, backbone, data), and the flags given
        apply on top of it (`--max_epochs 40`), whichever run is the newest.
        """
        super().parse_arguments(parser, args)
        if self.config.ckpt_path is None:
            return
        logger = self.run_folder_logger()
        if self.config.ckpt_path == "last":
            if not getattr(logger, "class_path", "").endswith(FOLDER_LOGGERS):
                raise ConfigError(
                    "--ckpt_path last needs a TensorBoardLogger or CSVLogger (first) to find "
                    "the run folders; give a file path"
                )
            experiment = Path(logger.init_args.save_dir) / logger.init_args.name
            checkpoint = resolve_checkpoint("last", experiment)
        elif Path(self.config.ckpt_path).is_file():
            checkpoint = Path(self.config.ckpt_path)
        else:
            raise ConfigError(
                f"ckpt_path {self.config.ckpt_path!r} is not a file; give a checkpoint file or "
                "'last'"
            )
        with contextlib.suppress(ConfigError):  # a checkpoint outside a run folder as it is
            config = ["--config", str(run_config(checkpoint))]
            given = sys.argv[1:] if args is None else list(args)  # type: ignore[call-overload]
            super().parse_arguments(parser, [*config, *given])
        self.config.ckpt_path = str(checkpoint)

    def run_folder_logger(self) -> object:
        """The first logger of the config: its save_dir/name/version_<N> is the run folder."""
        logger = self.config.trainer.logger
        return logger[0] if isinstance(logger, list) and logger else logger

    def before_instantiate_classes(self) -> None:
        check_devices(self.config.trainer.accelerator, self.config.trainer.devices)
        defaults = self.trainer_defaults.get("callbacks")
        if isinstance(defaults, list) and not wants_default_progress_bar(self.config.trainer):
            kept = [c for c in defaults if not isinstance(c, ProgressBar)]
            self.trainer_defaults["callbacks"] = kept
        if self.config.ckpt_path is None:
            return
        logger = self.run_folder_logger()
        ckpt_path = Path(self.config.ckpt_path)
        if getattr(logger, "class_path", "").endswith(FOLDER_LOGGERS) and (
            ckpt_path.parent.name == "checkpoints"
        ):
            # Keep logging into the folder of the run being resumed.
            run = ckpt_path.parent.parent
            logger.init_args.save_dir = str(run.parent.parent)
            logger.init_args.name = run.parent.name
            logger.init_args.version = run.name


def wants_default_progress_bar(trainer: object) -> bool:
    """The TQDM bar joins the run unless the bar is off or the config names a bar of its own.

    Lightning's own default is its Rich bar whenever rich is installed. In a terminal that
    bar took 11% of the default run's wall time (12.5-13.2 s against 11.3-11.6 s for TQDM
    and 11.2-11.9 s for none, four interleaved runs each); TQDM costs nothing measurable.
    """
    if getattr(trainer, "enable_progress_bar", None) is False:
        return False
    callbacks = getattr(trainer, "callbacks", None) or []
    for callback in callbacks if isinstance(callbacks, list) else [callbacks]:
        module, _, name = str(getattr(callback, "class_path", "")).rpartition(".")
        found = getattr(importlib.import_module(module), name, None) if module else None
        if isinstance(found, type) and issubclass(found, ProgressBar):
            return False
    return True


class OneLineErrors(LightningArgumentParser):
    """Reports a bad flag, key or value on one line instead of the whole usage text."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # jsonargparse is trying alternatives; let it go on
            super().error(message, ex)
        sys.exit(f"error: {' '.join(message.split())} (python train.py --help lists the options)")


def check_devices(accelerator: object, devices: object) -> None:
    """Refuse an accelerator or a device count this machine does not have, before any work."""
    name = str(getattr(accelerator, "class_path", accelerator)).lower()
    if name in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"--accelerator {name}: torch sees no CUDA GPU here; use --accelerator cpu "
            "(or auto), or install a torch build that matches the GPU driver"
        )
    if name not in ("auto", "cpu", "gpu", "cuda"):
        return  # other accelerators (mps, tpu, ...) check their own devices
    on_gpu = name != "cpu" and torch.cuda.is_available()
    available = torch.cuda.device_count() if on_gpu else os.cpu_count() or 1
    wanted = len(devices) if isinstance(devices, list) else devices
    if isinstance(wanted, str) and wanted.isdigit():
        wanted = int(wanted)
    if isinstance(wanted, int) and wanted > available:
        what = "GPUs torch sees" if on_gpu else "CPUs this machine has"
        raise ConfigError(f"--devices {devices} is more than the {available} {what}")


class SaveRunConfig(SaveConfigCallback):
    """Writes config.yaml into a new run folder; a resumed run keeps its first config.

    The saved config has no ckpt_path, so `--config config.yaml` repeats the run.
    """

    def __init__(self, parser: LightningArgumentParser, config, **kwargs) -> None:
        config = config.clone()
        config.ckpt_path = None
        super().__init__(parser, config, **kwargs)

    def setup(self, trainer, pl_module, stage: str) -> None:
        log_dir = trainer.log_dir  # a collective call: every rank must make it
        exists = trainer.is_global_zero and Path(log_dir, self.config_filename).exists()
        if trainer.strategy.broadcast(exists):
            self.already_saved = True
        super().setup(trainer, pl_module, stage)


def summary(trainer: Trainer, metrics: dict[str, float], log_dir: str) -> str:
    """What a run leaves behind, and the commands that go on from it."""
    checkpoint = trainer.checkpoint_callback
    best = "none"
    if checkpoint is not None and checkpoint.best_model_path:
        best = checkpoint.best_model_path
        # ddp_spawn hands the path back to this process, not the score.
        if checkpoint.best_model_score is not None:
            best += f"  ({checkpoint.monitor} {checkpoint.best_model_score:.4f})"
    tested = "  ".join(f"{key} {value:.4f}" for key, value in sorted(metrics.items()))
    rows = {
        "Best checkpoint": best,
        "Test": tested or "not run",
        "Run folder": f"{log_dir}  (config.yaml, checkpoints/, plots/, test_metrics.json)",
        "Watch": how_to_watch(log_dir),
        "Resume": f"python train.py --ckpt_path {log_dir}/checkpoints/last.ckpt "
        "--max_epochs <more>",
    }
    return "\n".join(f"{name + ':':<17}{value}" for name, value in rows.items())


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
    # Lightning's model summary estimates the size in MB from 32-bit weights under bf16-mixed.
    warnings.filterwarnings("ignore", message="Precision .* is not supported by the model summary")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: not record.getMessage().startswith("💡 Tip")
    )


# At import too: the processes ddp_spawn starts import this module (for SaveRunConfig) but
# never run main().
quiet_known_noise()


def fit(cli: LightningCLI) -> None:
    """trainer.fit, turning a divergence or a preemption signal into one line and an exit code."""
    if not SLURMEnvironment.detect():
        # Outside SLURM (which requeues on SIGUSR1 itself), SIGUSR1 means "save and stop" too.
        signal.signal(signal.SIGUSR1, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    trainer = cli.trainer
    try:
        trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.config.ckpt_path)
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
        sys.exit(out_of_step(trainer, timeout, cli.config.collective_timeout))


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


def check_resumable(model: torch.nn.Module, path: Path) -> None:
    """Refuse a checkpoint that is unsafe, damaged or cannot go on under this configuration.

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


def layer_differences(state: dict[str, Tensor], expected: dict[str, Tensor]) -> list[str]:
    """Each layer that is in only one of two state dicts, or has another shape in each."""
    differ = [f"{key} not in the model" for key in state.keys() - expected.keys()]
    differ += [f"{key} not in the checkpoint" for key in expected.keys() - state.keys()]
    differ += [
        f"{key} {tuple(state[key].shape)} (now {tuple(value.shape)})"
        for key, value in expected.items()
        if key in state and state[key].shape != value.shape
    ]
    return sorted(differ)


def class_of(value: object) -> object:
    """The class path of a class_path/init_args dict, else the value itself."""
    return value.get("class_path") if isinstance(value, dict) else value


def plain(value: object) -> object:
    """A shape as a tuple, whether it was saved as a list or a tuple."""
    return tuple(value) if isinstance(value, list | tuple) else value


def build_cli(args: list[str] | None, callbacks: Sequence[Callback] = ()) -> TrainCLI:
    """The model, data module and trainer of the command line, not run yet; evaluate uses it too.

    `callbacks` join the run without entering its saved config (the sweep's pruning callback).
    """
    with warnings.catch_warnings():
        # evaluate and export pass a list of their own; sys.argv holds their flags, not these.
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        return TrainCLI(
            ImageClassifier,
            DataModule,
            args=args,
            run=False,
            seed_everything_default=42,
            save_config_callback=SaveRunConfig,
            save_config_kwargs={"overwrite": True},
            parser_class=OneLineErrors,
            trainer_defaults={
                "callbacks": [
                    SyncEpochMetrics(),  # before the bar, so every rank syncs at one point
                    BatchSizeReport(),
                    EpochLine(),
                    ThroughputMonitor(samples_in, window_size=20),
                    RngState(),
                    StopOnDivergence(),
                    SaveOnPreemption(),
                    TQDMProgressBar(),  # dropped when the bar is off or the config has one
                    *callbacks,
                ]
            },
            auto_configure_optimizers=False,
        )


def main(args: list[str] | None = None, callbacks: Sequence[Callback] = ()) -> dict[str, float]:
    """Fit, then test the best checkpoint; return the test metrics."""
    quiet_known_noise()
    try:
        cli = build_cli(args, callbacks)
        if cli.config.ckpt_path:
            check_resumable(cli.model, Path(cli.config.ckpt_path))
            # ModelCheckpoint warns about any folder that holds checkpoints; here it should.
            folder = re.escape(str(Path(cli.config.ckpt_path).parent))
            warnings.filterwarnings("ignore", message=f"Checkpoint directory {folder} exists")
    except (ConfigError, MisconfigurationException) as error:
        # Lightning's own checks (e.g. a negative max_epochs) are one sentence too.
        sys.exit(f"error: {str(error).splitlines()[0]}")
    try:
        return fit_and_test(cli)
    finally:
        # The CLI object outlives the run (jsonargparse's parser context refers to it): let
        # go of what it built, so the trainer, its loaders and their worker processes go
        # with the run, not while the next run in this process (a sweep trial) has begun.
        cli.trainer = cli.model = cli.datamodule = cli.config_init = None
        cli.trainer_defaults = {}


def fit_and_test(cli: LightningCLI) -> dict[str, float]:
    """Fit, test the best checkpoint, write test_metrics.json and print the summary."""
    trainer = cli.trainer
    set_collective_timeout(trainer.strategy, cli.config.collective_timeout)
    for logger in trainer.loggers:
        # Fix the run folder (version_N) now, so processes spawned later all use this one.
        _ = logger.version
    fit(cli)
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    try:
        results = trainer.test(
            cli.model, datamodule=cli.datamodule, ckpt_path=best or None, verbose=False
        )
    except RuntimeError as error:
        if (timeout := collective_timeout(error)) is None:
            raise
        sys.exit(out_of_step(trainer, timeout, cli.config.collective_timeout))
    metrics = {key: float(value) for key, value in results[0].items()} if results else {}
    log_dir = trainer.log_dir  # a collective call: every rank must make it
    if trainer.is_global_zero and log_dir:
        path = Path(log_dir) / "test_metrics.json"
        path.write_text(json.dumps({"checkpoint": best, **metrics}, indent=2) + "\n")
        print(summary(trainer, metrics, log_dir))
    end_logger_runs()
    if torch.distributed.is_initialized():
        # Shut the process group down cleanly; left to interpreter exit, gloo can abort.
        destroy_process_group()
    return metrics


def destroy_process_group() -> None:
    """destroy_process_group, without the gloo deadlock of torch before 2.8.

    There, the process group's destructor holds the GIL while it joins gloo's worker threads,
    and a worker freeing the tensors of a finished collective (the last broadcast) waits for
    the GIL: both wait forever. The gloo backend's own Python object releases the GIL when it
    is destroyed, so it is held while the group goes and let go last.
    """
    world = torch.distributed.group.WORLD
    cpu = torch.device("cpu")
    gloo = world._get_backend(cpu) if "gloo" in torch.distributed.get_backend(world) else None
    del world
    torch.distributed.destroy_process_group()
    del gloo  # the last reference: gloo's threads stop here, with the GIL released


def end_logger_runs() -> None:
    """Close a W&B run: otherwise the next run in this process (a sweep trial) would reuse it."""
    wandb = sys.modules.get("wandb")  # imported only if a WandbLogger was used
    if wandb is not None and wandb.run is not None:
        wandb.run.finish()
