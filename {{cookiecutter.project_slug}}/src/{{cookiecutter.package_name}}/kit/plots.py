"""Pictures of a run, written into <run folder>/plots/ on rank 0: curves and a confusion matrix.

Figures are made with matplotlib's object API (no pyplot figure), which renders with Agg
and needs no display; torchmetrics draws the confusion matrix onto one.
"""

import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
from matplotlib.figure import Figure
from torch import Tensor
from torchmetrics.classification import MulticlassConfusionMatrix

from .errors import ConfigError

# file name -> (title, y label, the logged metrics drawn in it)
CURVES = {
    "loss.png": ("Loss", "cross-entropy", ("train/loss_epoch", "val/loss")),
    "accuracy.png": ("Accuracy", "accuracy", ("train/acc", "val/acc")),
}
TRAIN_KEYS = ("train/loss_epoch", "train/acc")
VAL_KEYS = ("val/loss", "val/acc")


class TrainingCurves(L.Callback):
    """Draws loss, accuracy and learning-rate curves from the metrics the run logged.

    Redrawn after a validation once `every_n_seconds` have passed since the last drawing
    (0: after every validation), and at the end of fit. Drawing with matplotlib is slow
    next to a training step, so the interval keeps it a small share of a long run, while a
    short run draws once. The history is kept in checkpoints, so a resumed run draws the
    whole run.
    """

    def __init__(self, every_n_seconds: float = 60.0) -> None:
        if every_n_seconds < 0:
            raise ConfigError(f"curves.every_n_seconds is {every_n_seconds}; accepted: 0 or more")
        self.every_n_seconds = every_n_seconds
        self.epochs: dict[str, dict[int, float]] = {key: {} for key in (*TRAIN_KEYS, *VAL_KEYS)}
        self.learning_rates: dict[int, float] = {}
        self.folder: Path | None = None
        self.last_drawn = 0.0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Found once, here, where every rank calls it: drawing is then rank 0's alone, so
        # its clock may decide when without the other ranks taking part.
        self.folder = plots_folder(trainer)
        self.last_drawn = time.monotonic()

    def on_train_batch_end(self, trainer: L.Trainer, *_: Any) -> None:
        if trainer.optimizers:
            self.learning_rates[trainer.global_step] = trainer.optimizers[0].param_groups[0]["lr"]

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The module logs the training metrics of an epoch after the callbacks' epoch end.
        self._record(trainer, TRAIN_KEYS, trainer.current_epoch - 1)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self._record(trainer, VAL_KEYS, trainer.current_epoch)
        if time.monotonic() - self.last_drawn >= self.every_n_seconds:
            self.draw()

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._record(trainer, TRAIN_KEYS, trainer.current_epoch - 1)
        self.draw()

    def draw(self) -> None:
        self.last_drawn = time.monotonic()
        if self.folder is None:
            return
        for name, (title, ylabel, keys) in CURVES.items():
            series = {key: self.epochs[key] for key in keys if self.epochs[key]}
            if series:
                save(line_plot(title, "epoch", ylabel, series), self.folder / name)
        if self.learning_rates:
            figure = line_plot(
                "Learning rate", "step", "learning rate", {"lr": self.learning_rates}
            )
            save(figure, self.folder / "learning_rate.png")

    def state_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "learning_rates": self.learning_rates}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epochs = state_dict["epochs"]
        self.learning_rates = state_dict["learning_rates"]

    def _record(self, trainer: L.Trainer, keys: Sequence[str], epoch: int) -> None:
        metrics = trainer.callback_metrics
        for key in keys:
            if key in metrics and epoch >= 0:
                self.epochs[key][epoch] = float(metrics[key])


class ConfusionMatrixPlot(L.Callback):
    """After test, draws plots/confusion_matrix.png from the logits `test_step` returns.

    The matrix is a torchmetrics metric, so under DDP it counts every process's samples.
    """

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "test":
            self.matrix = MulticlassConfusionMatrix(pl_module.hparams.num_classes)

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.matrix = self.matrix.to(pl_module.device)
        self.matrix.reset()

    def on_test_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Tensor, batch: Any, *_: Any
    ) -> None:
        self.matrix.update(outputs, batch[1])

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        counts = self.matrix.compute().cpu()  # every process takes part in the gather
        folder = plots_folder(trainer)
        if folder is not None:
            names = getattr(trainer.datamodule, "class_names", None)
            save(confusion_figure(self.matrix, counts, names), folder / "confusion_matrix.png")


def plots_folder(trainer: L.Trainer) -> Path | None:
    """<run folder>/plots on rank 0; None on other ranks and in runs that write no folder."""
    log_dir = trainer.log_dir  # a collective call: every rank must make it
    if not trainer.is_global_zero or log_dir is None or trainer.fast_dev_run:
        return None
    folder = Path(log_dir) / "plots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def line_plot(title: str, xlabel: str, ylabel: str, series: dict[str, dict[int, float]]) -> Figure:
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.add_subplot()
    for label, points in series.items():
        xs = sorted(points)
        axes.plot(xs, [points[x] for x in xs], marker="." if len(xs) < 50 else None, label=label)
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    axes.grid(alpha=0.3)
    axes.legend()
    return figure


def confusion_figure(
    matrix: MulticlassConfusionMatrix, counts: Tensor, class_names: Sequence[str] | None
) -> Figure:
    """`counts` (rows: true class, columns: predicted class) drawn by the metric's own plot,
    each cell with its count (up to 30 classes), the axes named by class."""
    n = len(counts)
    size = min(max(4.0, 0.45 * n + 2), 20.0)
    figure = Figure(figsize=(size, size), layout="constrained")
    axes = figure.add_subplot()
    labels = list(class_names) if class_names is not None else None
    with warnings.catch_warnings():
        # torchmetrics gives matplotlib the tensor, whose __array__ numpy 2 calls dated.
        warnings.filterwarnings("ignore", "__array__ implementation", DeprecationWarning)
        # Beyond 30 classes the numbers no longer fit in the cells.
        matrix.plot(counts, ax=axes, add_text=n <= 30, labels=labels, cmap="Blues")
    figure.colorbar(axes.images[0], ax=axes, shrink=0.8)
    axes.set_title("Confusion matrix (test)")
    # Long class names end under their column and read level beside their row.
    for name in axes.get_xticklabels():
        name.set_horizontalalignment("right")
    axes.tick_params(axis="y", labelrotation=0)
    for count in axes.texts:
        count.set_fontsize(8)
    return figure


def save(figure: Figure, path: Path) -> None:
    figure.savefig(path, dpi=100)
