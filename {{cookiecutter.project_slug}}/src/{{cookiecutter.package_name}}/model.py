"""The LightningModule: how a backbone is trained, evaluated and optimised."""

from collections.abc import Callable

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import grad_norm
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from .backbones import ConvNet
from .kit.compat import module_logs_this_step
from .kit.errors import ConfigError
from .kit.layers import (
    contiguous_single_channel_grads,
    features,
    last_linear,
    readable_name,
    to_channels_last,
)
from .kit.metrics import EpochMeans, log_metrics, on_logging_steps
from .kit.schedules import warmup_cosine

# (in_channels, num_classes) -> network; chosen in configs by class_path.
BackboneFactory = Callable[[int, int], nn.Module]
# () -> loss module, called as loss(logits, labels); chosen in configs by class_path.
LossFactory = Callable[[], nn.Module]

Batch = tuple[Tensor, Tensor]


class ImageClassifier(L.LightningModule):
    """Classifies images with `backbone`, trained on `loss(logits, labels)`.

    `num_classes` and `input_shape` come from the data module (argument links).
    `loss` is any loss class chosen by class_path (train.py's default: cross-entropy with
    label smoothing 0.1); training, validation and test use it.
    `scheduler` is any torch LR scheduler chosen by class_path (StepLR,
    ReduceLROnPlateau on val/loss, ...); left unset, the learning rate warms up
    linearly for `warmup_fraction` of the training steps, then decays along a
    cosine, stepped every batch. `compile` compiles the backbone with torch.compile
    in place, so checkpoints stay interchangeable with uncompiled runs.
    `channels_last` stores the backbone's image-shaped (4-D) weights channels-last
    (NHWC); a convolution then keeps its feature maps in that layout too, which
    oneDNN on CPUs and tensor cores on GPUs run faster. Checkpoints are the same
    either way. Turn it off for a backbone that calls `.view` on feature maps
    (`.reshape` works).
    `grad_norm_every_n_steps` logs the gradient norm of every parameter and their
    total every that many optimizer steps (0: never; each one syncs with the device).
    `backbone_lr_factor` gives the layers before the classifier (the backbone's last linear
    layer) that share of the learning rate (0.1: fine-tuning pretrained layers gently); the
    two parameter groups, "classifier" and "features", are logged apiece by the LR monitor.
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, int, int],
        backbone: BackboneFactory = ConvNet,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        scheduler: LRSchedulerCallable | None = None,
        warmup_fraction: float = 0.05,
        loss: LossFactory = nn.CrossEntropyLoss,
        compile: bool = False,
        grad_norm_every_n_steps: int = 0,
        channels_last: bool = True,
        backbone_lr_factor: float = 1.0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.backbone = backbone(input_shape[0], num_classes)
        if channels_last:
            to_channels_last(self.backbone)
        if compile:
            # Module.compile keeps parameter names (no "_orig_mod." prefix in checkpoints).
            # The backbone, not this LightningModule: compiling that breaks self.log.
            self.backbone.compile()
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loss = loss()
        metrics = MetricCollection(
            {
                # The share of images classified correctly, as papers and scikit-learn report
                # it (torchmetrics' own default is the mean of the per-class accuracies).
                "acc": MulticlassAccuracy(num_classes, average="micro"),
                "f1": MulticlassF1Score(num_classes, average="macro"),
            }
        )
        # Each holds the steps' predictions and is updated with them on the training steps
        # that log and at the end: an update makes a GPU wait (torch.bincount).
        metrics = on_logging_steps(metrics)
        self.train_metrics = metrics.clone(prefix="train/")
        # --monitor takes val/loss or any metric of this collection; torchmetrics' own
        # higher_is_better says which way it is better (a new metric here is monitorable too).
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        # The losses' means over an epoch, a validation or test run: one metric update a step.
        self.epoch_means = EpochMeans()
        self.example_input_array = torch.zeros(2, *input_shape)
        # ThroughputMonitor reads this; None: it logs samples and batches per second, no FLOPs.
        self.flops_per_batch: int | None = None

    def forward(self, x: Tensor) -> Tensor:
        return self.backbone(x)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = self.loss(logits, y)
        self._log_step_and_epoch("train/loss", loss, len(y), prog_bar=True)
        log_metrics(self, self.train_metrics, logits, y)
        if terms := self.regularization():
            for name, term in terms.items():
                self._log_step_and_epoch(f"train/regularization/{name}", term, len(y))
            total = torch.stack(list(terms.values())).sum()
            self._log_step_and_epoch("train/regularization", total, len(y))
            loss = loss + total  # minimised; train/loss stays the data loss, like val/loss
        return loss

    def _log_step_and_epoch(
        self, name: str, value: Tensor, batch_size: int, prog_bar: bool = False
    ) -> None:
        # <name>_step is this process's value: averaging it over the processes every step
        # would make each wait for the others, and showing it in the bar (prog_bar) the host
        # for the device (the bar shows train/loss_step when it logs: configs/default.yaml).
        # It is logged only on the steps that write to the loggers, the only ones that keep
        # it: every self.log call is a lot of Python work for Lightning, on every step.
        # <name>_epoch is the epoch's mean over all processes, averaged once, at its end.
        if module_logs_this_step(self):
            self.log(f"{name}_step", value)
        self.epoch_means.log(self, f"{name}_epoch", value, batch_size, prog_bar=prog_bar)

    def regularization(self) -> dict[str, Tensor]:
        """The extra loss terms that the backbone's modules carry, by readable module name:
        each module's `regularization_loss()` (None: no term, e.g. a penalty of 0)."""
        terms = {}
        for name, module in self.backbone.named_modules():
            method = getattr(module, "regularization_loss", None)
            if callable(method) and (term := method()) is not None:
                readable = readable_name(self.backbone, name)
                terms[name if readable in terms else readable] = term
        return terms

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_metrics)

    def test_step(self, batch: Batch, batch_idx: int) -> Tensor:
        return self._evaluate(batch, "test", self.test_metrics)

    def predict_step(self, batch: Tensor | Batch, batch_idx: int) -> Tensor:
        x = batch[0] if isinstance(batch, tuple | list) else batch
        return self(x).softmax(dim=-1)

    def configure_optimizers(self) -> dict:
        optimizer = self.optimizer(self.parameter_groups())
        for group in optimizer.param_groups:
            if group.get("name") == "features":  # the optimizer's own learning rate, scaled
                group["lr"] *= self.hparams.backbone_lr_factor
        if self.scheduler is None:
            total = int(self.trainer.estimated_stepping_batches)
            # A schedule too short for its warmup says so (one line, at start).
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

    def parameter_groups(self) -> list[dict]:
        """The optimizer's parameter groups, named for the LR monitor: the backbone's
        classifier (its last linear layer) and the rest ("features", at the optimizer's
        learning rate times backbone_lr_factor); one group if it has no classifier."""
        layers = features(self.backbone)
        if not layers or not last_linear(self.backbone):
            return [{"params": list(self.parameters())}]
        ids = {id(parameter) for parameter in layers}
        head = [parameter for parameter in self.parameters() if id(parameter) not in ids]
        return [{"params": head, "name": "classifier"}, {"params": layers, "name": "features"}]

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self._check_input_shape()
            if self.hparams.channels_last:
                contiguous_single_channel_grads(self.backbone)

    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        # Gradients are unscaled here under mixed precision, so the norms are the true ones.
        every = self.hparams.grad_norm_every_n_steps
        if every and self.trainer.global_step % every == 0:
            # Straight to the loggers: self.log would repeat the last norms at every logging step.
            norms = grad_norm(self.backbone, norm_type=2)
            norms = {key: norm.item() for key, norm in norms.items()}
            for logger in self.loggers:
                logger.log_metrics(norms, step=self.trainer.global_step)

    def _evaluate(self, batch: Batch, stage: str, metrics: MetricCollection) -> Tensor:
        x, y = batch
        logits = self(x)
        self.epoch_means.log(self, f"{stage}/loss", self.loss(logits, y), len(y), prog_bar=True)
        log_metrics(self, metrics, logits, y)
        return logits

    def _check_input_shape(self) -> None:
        """Fail before training, in one line, if the data's images are not of the shape it
        declared (the backbone was tried on that shape before the run folder existed)."""
        expected = tuple(self.hparams.input_shape)
        datamodule = self.trainer.datamodule
        train_set = getattr(datamodule, "train_set", None)
        shape = tuple(train_set[0][0].shape) if train_set is not None else expected
        if shape != expected:
            raise ConfigError(
                f"the data's images have shape {shape} but data.input_shape says {expected}"
            )
