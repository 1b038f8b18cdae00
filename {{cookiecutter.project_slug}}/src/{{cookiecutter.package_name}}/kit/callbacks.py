"""Small callbacks the command line adds to every run."""

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
from jsonargparse.typing import NonNegativeFloat
from lightning.pytorch.callbacks.progress.progress_bar import get_standard_metrics
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torch.optim import Optimizer

from .compat import (
    PacingHook,
    add_metric_states,
    logs_this_step,
    metric_states,
    running_epoch_metrics,
)
from .errors import ConfigError
from .layers import features, last_linear
from .metrics import OnLoggingSteps

# The checkpoint key of the metric objects' counts of an epoch still running.
RUNNING_METRICS = "running_epoch_metrics"


class BatchSizeReport(L.Callback):
    """Says at the start of fit how many samples one optimizer step sees across all processes.

    `data.batch_size` is per process (per device); the effective batch grows with the
    number of devices, nodes and accumulated batches.
    """

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        per_device = trainer.datamodule.batch_size
        accumulate = trainer.accumulate_grad_batches
        total = per_device * trainer.world_size * accumulate
        rank_zero_info(
            f"Effective batch size: {total} = {per_device} per device x {trainer.num_devices} "
            f"device(s) x {trainer.num_nodes} node(s) x {accumulate} accumulated batch(es)"
        )


class SyncEpochMetrics(L.Callback):
    """Computes the epoch's logged metrics on every process as soon as the epoch ends, and
    keeps a running epoch's metric objects in a checkpoint written mid-epoch.

    Computing them synchronises the processes (a sync_dist value is all-reduced, a
    torchmetrics metric gathers its counts). Lightning's progress bar, on rank 0 only, would
    otherwise compute them in its own epoch-end hook while the other processes go on to the
    next hook: a collective there (in a later callback or the model's own
    `on_train_epoch_end`) would then wait for a different one on rank 0, and the run would
    hang. This callback runs before the bar, on every process.

    A run resumed mid-epoch from such a checkpoint adds the kept counts to its metric objects
    after its first step, so the epoch's metrics (`train/loss_epoch`, `train/acc`, ...) count
    the steps before the stop too, as in a run that never stopped. One process only: under
    DDP the checkpoint holds the first process's objects alone, and the loader's position is
    not restored either (README, "Exact resume").
    """

    def __init__(self) -> None:
        self.kept: dict[str, Any] | None = None  # from the checkpoint a run resumes from

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _ = trainer.callback_metrics  # computed once here, on every rank; cached for the rest

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        running = running_epoch_metrics(trainer) if trainer.world_size == 1 else {}
        for metric in running.values():
            if isinstance(metric, OnLoggingSteps):
                metric.apply_held()
        if running:
            states = {key: metric_states(metric) for key, metric in running.items()}
            checkpoint[RUNNING_METRICS] = {"epoch": trainer.current_epoch, "states": states}

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self.kept = checkpoint.get(RUNNING_METRICS)

    def on_train_batch_end(self, trainer: L.Trainer, *_: Any) -> None:
        if self.kept is None:
            return
        kept, self.kept = self.kept, None
        if kept["epoch"] != trainer.current_epoch or trainer.world_size != 1:
            return
        running = running_epoch_metrics(trainer)
        left = [key for key, states in kept["states"].items()
                if key not in running or not add_metric_states(running[key], states)]  # fmt: skip
        if left:
            rank_zero_info(
                f"The epoch's metrics {', '.join(k.split('.', 1)[-1] for k in left)} count "
                "the steps since the resume only"
            )


class BestValidation(L.Callback):
    """Writes val_metrics.json into the run folder: every validation metric of the epoch whose
    monitored value was best so far, which is the epoch of the best checkpoint.

    Repeated runs, cross-validation folds and the table of runs (results.py) read it.
    """

    def __init__(self) -> None:
        self.best: dict[str, float] | None = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        # Read on every rank (reading may compute, and computing synchronises).
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        checkpoint = trainer.checkpoint_callback
        monitor = getattr(checkpoint, "monitor", None) or "val/loss"
        if monitor not in metrics:
            return
        if self.best is not None and not better(
            metrics[monitor], self.best[monitor], getattr(checkpoint, "mode", "min")
        ):
            return
        self.best = {"epoch": trainer.current_epoch, **metrics}
        log_dir = trainer.log_dir  # a collective call: every rank must make it
        if trainer.is_global_zero and log_dir:
            path = Path(log_dir) / "val_metrics.json"
            path.write_text(json.dumps({"monitor": monitor, **self.best}, indent=2) + "\n")

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best = state_dict.get("best")


def better(value: float, best: float, mode: str) -> bool:
    """Strictly better, as ModelCheckpoint decides: the first of equal values stays best."""
    return value > best if mode == "max" else value < best


class EpochLine(L.Callback):
    """Prints one line per finished epoch with its main metrics, above the progress bar: the
    losses, the accuracies and the metric the best checkpoint is chosen by (`--monitor`).

    The model logs an epoch's training metrics after the callbacks' epoch-end hooks, so
    each line is printed when the next epoch starts, or when training ends.
    """

    KEYS = ("train/loss_epoch", "train/acc", "val/loss", "val/acc")

    def __init__(self) -> None:
        self.printed = -1

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.report(trainer, trainer.current_epoch - 1)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.report(trainer, trainer.current_epoch - 1)

    def report(self, trainer: L.Trainer, epoch: int) -> None:
        # Read on every rank (reading may compute, and computing synchronises); print on one.
        monitored = [c.monitor for c in trainer.checkpoint_callbacks if c.monitor]
        keys = dict.fromkeys([*self.KEYS, *monitored])
        metrics = {key: trainer.callback_metrics.get(key) for key in keys}
        shown = "  ".join(f"{k} {float(v):.4f}" for k, v in metrics.items() if v is not None)
        if epoch <= self.printed or not shown or not trainer.is_global_zero:
            return
        self.printed = epoch
        # Numbered from 0, like the progress bar and the checkpoint names.
        last = f"/{trainer.max_epochs - 1}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        line = f"Epoch {epoch}{last}: {shown}"
        bar = trainer.progress_bar_callback
        if bar is not None:
            bar.print(line)  # printed through the bar, so the bar is not torn
        else:
            rank_zero_info(line)


NOTHING_TO_FREEZE = (
    "freeze_backbone: the optimizer has no parameter group named 'features' (the layers "
    "before the classifier, which the model names when its network ends in a linear layer): "
    "give a network that does, or leave freeze_backbone out"
)


class FreezeBackbone(L.Callback):
    """Trains the classifier alone for the first `epochs` epochs, then the whole network.

    While frozen, the layers before the classifier (the backbone's last linear layer) get no
    update: their gradients are dropped after the backward pass, once DDP has synchronised
    them, and an optimizer skips a parameter without one (no step, no weight decay, no state).
    Their normalisation layers' running statistics, which are no parameters, still follow the
    new data (as Lightning's BaseFinetuning does with its default, train_bn=True).
    Their parameter group's learning rate reads 0 meanwhile, so the LR monitor shows the
    frozen epochs; the schedule's own value is back before every optimizer step and in every
    checkpoint. Frozen or not follows from the epoch alone: a resumed run freezes exactly as
    the original did.
    """

    def __init__(self, epochs: int = 1) -> None:
        self.epochs = epochs
        self.scheduled: dict[int, float] = {}  # group index -> scheduled rate, while it reads 0

    def check_model(self, model: L.LightningModule) -> None:
        """Called as the run is built (cli.py), before any work: a network without layers
        before a classifier would have nothing frozen, without a word."""
        network = getattr(model, "backbone", None)
        frozen = isinstance(network, nn.Module) and last_linear(network) and features(network)
        if self.epochs and not frozen:
            raise ConfigError(NOTHING_TO_FREEZE)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        groups = trainer.optimizers[0].param_groups if trainer.optimizers else []
        if self.epochs and not any(group.get("name") == "features" for group in groups):
            raise ConfigError(NOTHING_TO_FREEZE)  # a model that names its groups otherwise
        if trainer.max_epochs is not None and 0 <= trainer.max_epochs <= self.epochs:
            rank_zero_info(
                f"freeze_backbone.epochs {self.epochs} >= max_epochs {trainer.max_epochs}: only "
                "the classifier trains in this run; more epochs train the whole network"
            )

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: object, batch_idx: int
    ) -> None:
        if trainer.current_epoch < self.epochs and not self.scheduled:
            for index, group in enumerate(trainer.optimizers[0].param_groups):
                if group.get("name") == "features":
                    self.scheduled[index], group["lr"] = group["lr"], 0.0

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch < self.epochs:
            for group in trainer.optimizers[0].param_groups:
                if group.get("name") == "features":  # the model's layers before its classifier
                    for parameter in group["params"]:
                        parameter.grad = None

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Optimizer
    ) -> None:
        self.restore(optimizer.param_groups)

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        for index, rate in self.scheduled.items():  # saved mid-step: the schedule's value
            checkpoint["optimizer_states"][0]["param_groups"][index]["lr"] = rate

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if trainer.optimizers:
            self.restore(trainer.optimizers[0].param_groups)

    def restore(self, groups: list[dict[str, Any]]) -> None:
        for index, rate in self.scheduled.items():
            groups[index]["lr"] = rate
        self.scheduled = {}


class StepProgressBar(PacingHook):
    """Lightning's TQDM bar, whose count moves every step and whose metrics are read on the
    steps that log (every `log_every_n_steps`) and at the end of each epoch and stage.

    Reading a logged tensor as a number makes the host wait for the device. Lightning reads
    the metrics logged with `prog_bar=True` in a training step at every step; this bar shows
    the `step_metrics` that the model logs without it, read only when due, and the epoch's.
    """

    def __init__(self, step_metrics: Sequence[str] = ("train/loss_step",), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step_metrics = list(step_metrics)
        self.shown: dict[str, Any] | None = None  # the metrics drawn last
        self.due = True

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        self.due = logs_this_step(trainer)
        try:
            super().on_train_batch_end(trainer, pl_module, *args)
        finally:
            self.due = True

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        if self.due or self.shown is None:
            logged = trainer.callback_metrics
            shown = super().get_metrics(trainer, pl_module)
            steps = {k: float(logged[k]) for k in self.step_metrics if k in logged and self.due}
            self.shown = {**get_standard_metrics(trainer), **steps, **shown}
        return self.shown


class PacedProgressBar(StepProgressBar):
    """This project's bar, redrawn at most once every `min_interval` seconds and always at
    the end of an epoch or stage: the pace tqdm keeps for its own bars (0: every step).

    For output that goes to a file, such as a cluster job's log: the default bar redraws at
    every step, past tqdm's own pacing, and each redraw is appended to the file. Choose
    it with `--progress_bar <package>.kit.callbacks.PacedProgressBar`.
    """

    # NonNegativeFloat: the command line refuses a negative interval while parsing.
    def __init__(self, min_interval: NonNegativeFloat = 0.1, **kwargs: int | bool) -> None:
        if not min_interval >= 0:
            raise ConfigError(f"min_interval is {min_interval}; accepted: 0 or more seconds")
        super().__init__(**kwargs)
        self.min_interval = min_interval
        self.drawn_at = -math.inf

    def may_redraw(self, current: int, total: int) -> bool:
        # Asked after Lightning's own test (its refresh_rate, the last batch).
        now = time.monotonic()
        if current != total and now - self.drawn_at < self.min_interval:
            return False
        self.drawn_at = now
        return True


def samples_in(batch: tuple[Tensor, Tensor]) -> int:
    """The number of samples in a batch (ThroughputMonitor's batch_size_fn)."""
    return len(batch[0])
