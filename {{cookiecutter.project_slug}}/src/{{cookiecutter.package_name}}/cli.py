"""The command line: LightningCLI with short flags, argument links and one folder per run.

python train.py                                   fit, then test the best checkpoint
python train.py --devices 2 --max_epochs 5        short forms of --trainer.*
python train.py --config configs/resnet18.yaml    any --trainer.*, --model.*, --data.* key
python train.py --ckpt_path last                  resume the newest run of this experiment
"""

import json
import logging
import sys
import warnings
from argparse import SUPPRESS
from pathlib import Path

import torch
from lightning import Trainer
from lightning.pytorch.callbacks import (
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    ThroughputMonitor,
)
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_only

from .callbacks import BatchSizeReport, EpochLine, samples_in
from .data import DataModule
from .datamodule import ConfigError
from .loggers import LOGGER, how_to_watch
from .model import ImageClassifier
from .plots import ConfusionMatrixPlot, TrainingCurves

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

        # Two checkpoint callbacks: the best by val/acc, and the newest state for resuming
        # (ModelCheckpoint's own save_last only refreshes when the best improves).
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_lightning_class_args(ModelCheckpoint, "last_checkpoint")
        parser.add_lightning_class_args(EarlyStopping, "early_stopping")
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.add_lightning_class_args(TrainingCurves, "curves")
        parser.add_lightning_class_args(ConfusionMatrixPlot, "confusion_matrix")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val/acc",
                "checkpoint.mode": "max",
                "checkpoint.filename": "epoch{epoch:03d}-val_acc{val/acc:.4f}",
                "checkpoint.auto_insert_metric_name": False,
                "last_checkpoint.filename": "last",
                "last_checkpoint.enable_version_counter": False,
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

    def before_instantiate_classes(self) -> None:
        ckpt_path = self.config.ckpt_path
        if ckpt_path is None:
            return
        logger = self.config.trainer.logger
        logger = logger[0] if isinstance(logger, list) and logger else logger
        run_folders = getattr(logger, "class_path", "").endswith(FOLDER_LOGGERS)
        if ckpt_path == "last":
            if not run_folders:
                raise ConfigError(
                    "--ckpt_path last needs a TensorBoardLogger or CSVLogger (first) to find "
                    "the run folders; give a file path"
                )
            ckpt_path = newest_last_checkpoint(
                Path(logger.init_args.save_dir) / logger.init_args.name
            )
        elif not Path(ckpt_path).is_file():
            raise ConfigError(
                f"ckpt_path {ckpt_path!r} is not a file; give a checkpoint file or 'last'"
            )
        ckpt_path = Path(ckpt_path)
        self.config.ckpt_path = str(ckpt_path)
        if run_folders and ckpt_path.parent.name == "checkpoints":
            # Keep logging into the folder of the run being resumed.
            run = ckpt_path.parent.parent
            if logger.class_path.endswith("CSVLogger"):
                keep_earlier_metrics(run)
            logger.init_args.save_dir = str(run.parent.parent)
            logger.init_args.name = run.parent.name
            logger.init_args.version = run.name


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


def newest_last_checkpoint(experiment: Path) -> Path:
    """The `last.ckpt` of the most recently written run under runs/<experiment>/."""
    candidates = sorted(
        experiment.glob("version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime
    )
    if not candidates:
        raise ConfigError(
            f"--ckpt_path last: no run under {experiment} has a checkpoints/last.ckpt to resume"
        )
    return candidates[-1]


@rank_zero_only
def keep_earlier_metrics(run: Path) -> None:
    """Rename metrics.csv to metrics-<k>.csv: CSVLogger deletes it when it logs into the folder."""
    metrics = run / "metrics.csv"
    if metrics.is_file():
        metrics.rename(run / f"metrics-{len(list(run.glob('metrics-*.csv')))}.csv")


def summary(trainer: Trainer, metrics: dict[str, float], log_dir: str) -> str:
    """What a run leaves behind, and the commands that go on from it."""
    checkpoint = trainer.checkpoint_callback
    best = "none"
    if checkpoint is not None and checkpoint.best_model_path:
        score = f"{checkpoint.monitor} {checkpoint.best_model_score:.4f}"
        best = f"{checkpoint.best_model_path}  ({score})"
    tested = "  ".join(f"{key} {value:.4f}" for key, value in sorted(metrics.items()))
    rows = {
        "Best checkpoint": best,
        "Test": tested or "not run",
        "Run folder": f"{log_dir}  (config.yaml, checkpoints/, plots/, test_metrics.json)",
        "Watch": how_to_watch(log_dir),
        "Resume": f"python train.py --config {log_dir}/config.yaml --ckpt_path "
        f"{log_dir}/checkpoints/last.ckpt --max_epochs <more>",
    }
    return "\n".join(f"{name + ':':<17}{value}" for name, value in rows.items())


def quiet_known_noise() -> None:
    """Silence third-party messages that say nothing about this project's runs."""
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
    # jsonargparse deprecations triggered inside Lightning's own CLI code.
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="lightning.pytorch.cli")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: not record.getMessage().startswith("💡 Tip")
    )


def main(args: list[str] | None = None) -> dict[str, float]:
    """Fit, then test the best checkpoint; return the test metrics."""
    quiet_known_noise()
    try:
        cli = TrainCLI(
            ImageClassifier,
            DataModule,
            args=args,
            run=False,
            seed_everything_default=42,
            save_config_callback=SaveRunConfig,
            save_config_kwargs={"overwrite": True},
            trainer_defaults={
                "callbacks": [
                    BatchSizeReport(),
                    EpochLine(),
                    ThroughputMonitor(samples_in, window_size=20),
                ]
            },
            auto_configure_optimizers=False,
        )
    except ConfigError as error:
        sys.exit(f"error: {error}")
    trainer = cli.trainer
    for logger in trainer.loggers:
        # Fix the run folder (version_N) now, so processes spawned later all use this one.
        _ = logger.version
    try:
        trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.config.ckpt_path)
    except ConfigError as error:
        sys.exit(f"error: {error}")
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    results = trainer.test(
        cli.model, datamodule=cli.datamodule, ckpt_path=best or None, verbose=False
    )
    metrics = {key: float(value) for key, value in results[0].items()} if results else {}
    log_dir = trainer.log_dir  # a collective call: every rank must make it
    if trainer.is_global_zero and log_dir:
        path = Path(log_dir) / "test_metrics.json"
        path.write_text(json.dumps({"checkpoint": best, **metrics}, indent=2) + "\n")
        print(summary(trainer, metrics, log_dir))
    if torch.distributed.is_initialized():
        # Shut the process group down cleanly; left to interpreter exit, gloo can abort.
        torch.distributed.destroy_process_group()
    return metrics
