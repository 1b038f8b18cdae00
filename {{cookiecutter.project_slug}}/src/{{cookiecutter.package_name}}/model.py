"""The LightningModule: how a backbone is trained, evaluated and optimised."""

import math
from collections.abc import Callable

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import (
    CosineAnnealingLR,
    LinearLR,
    LRScheduler,
    ReduceLROnPlateau,
    SequentialLR,
)
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from .backbones import SmallCNN

# (in_channels, num_classes) -> network; chosen in configs by class_path.
BackboneFactory = Callable[[int, int], nn.Module]

Batch = tuple[Tensor, Tensor]


class ImageClassifier(L.LightningModule):
    """Classifies images with `backbone`; the loss is cross-entropy on logits.

    `num_classes` and `input_shape` come from the data module (argument links).
    `scheduler` is any torch LR scheduler chosen by class_path (StepLR,
    ReduceLROnPlateau on val/loss, ...); left unset, the learning rate warms up
    linearly for `warmup_fraction` of the training steps, then decays along a
    cosine, stepped every batch. `compile` compiles the backbone with torch.compile
    in place, so checkpoints stay interchangeable with uncompiled runs.
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, int, int],
        backbone: BackboneFactory = SmallCNN,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        scheduler: LRSchedulerCallable | None = None,
        warmup_fraction: float = 0.05,
        label_smoothing: float = 0.0,
        compile: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.backbone = backbone(input_shape[0], num_classes)
        if compile:
            # Module.compile keeps parameter names (no "_orig_mod." prefix in checkpoints).
            # The backbone, not this LightningModule: compiling that breaks self.log.
            self.backbone.compile()
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loss = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        metrics = MetricCollection(
            {
                "acc": MulticlassAccuracy(num_classes),
                "f1": MulticlassF1Score(num_classes, average="macro"),
            }
        )
        self.train_metrics = metrics.clone(prefix="train/")
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        self.example_input_array = torch.zeros(2, *input_shape)

    def forward(self, x: Tensor) -> Tensor:
        return self.backbone(x)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = self.loss(logits, y)
        self.train_metrics.update(logits, y)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_metrics)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "test", self.test_metrics)

    def predict_step(self, batch: Tensor | Batch, batch_idx: int) -> Tensor:
        x = batch[0] if isinstance(batch, tuple | list) else batch
        return self(x).softmax(dim=-1)

    def configure_optimizers(self) -> dict:
        optimizer = self.optimizer(self.parameters())
        if self.scheduler is None:
            total = int(self.trainer.estimated_stepping_batches)
            scheduler = warmup_cosine(optimizer, total, self.hparams.warmup_fraction)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
            }
        scheduler = self.scheduler(optimizer)
        config = {"scheduler": scheduler, "interval": "epoch"}
        if isinstance(scheduler, ReduceLROnPlateau):
            config["monitor"] = "val/loss"
        return {"optimizer": optimizer, "lr_scheduler": config}

    def on_train_epoch_end(self) -> None:
        self._log_metrics(self.train_metrics)

    def on_validation_epoch_end(self) -> None:
        self._log_metrics(self.val_metrics)

    def on_test_epoch_end(self) -> None:
        self._log_metrics(self.test_metrics)

    def _evaluate(self, batch: Batch, stage: str, metrics: MetricCollection) -> None:
        x, y = batch
        logits = self(x)
        metrics.update(logits, y)
        self.log(f"{stage}/loss", self.loss(logits, y), sync_dist=True, prog_bar=True)

    def _log_metrics(self, metrics: MetricCollection) -> None:
        # compute() already gathers every process's state; sync_dist only says so to Lightning.
        self.log_dict(metrics.compute(), prog_bar=True, sync_dist=True)
        metrics.reset()


def warmup_cosine(optimizer: Optimizer, total_steps: int, warmup_fraction: float) -> LRScheduler:
    """Linear warmup from 1% of the learning rate, then cosine decay to zero."""
    warmup = min(max(1, math.ceil(total_steps * warmup_fraction)), max(1, total_steps - 1))
    return SequentialLR(
        optimizer,
        schedulers=[
            LinearLR(optimizer, start_factor=0.01, total_iters=warmup),
            CosineAnnealingLR(optimizer, T_max=max(1, total_steps - warmup)),
        ],
        milestones=[warmup],
    )
