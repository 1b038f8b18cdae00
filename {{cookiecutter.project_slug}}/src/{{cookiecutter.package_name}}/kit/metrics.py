"""Metrics logged through Lightning once an epoch: the epoch means of per-step values (a loss,
its terms), metric objects, and metric objects updated only on the steps that log."""

from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import Metric, MetricCollection
from torchmetrics.aggregation import MeanMetric

from .compat import evaluation_loaders, module_holds_for_this_epoch, module_logs_this_step

# What OnLoggingSteps holds at most between two logging steps, in bytes of its inputs.
HELD_BYTES = 64 * 2**20


class EpochMeans(nn.Module):
    """The mean of each named value over an epoch (each validation or test run), weighted by
    batch size, over all processes: what `self.log(name, value, on_step=False, on_epoch=True,
    sync_dist=True)` logs, for the Python work of a torchmetrics update a step instead of a
    `self.log` call's.

    Each name gets a `MeanMetric`, made at its first value, on that value's device. It is
    logged on the first step after Lightning resets its results; Lightning keeps a logged
    metric object, computes it (gathering every process's sums) at the epoch's end on every
    process at the same point, and resets it. The means are not part of the state_dict, so
    checkpoints are the same with or without them. A non-finite value makes the mean
    non-finite, as with `self.log`: checking each value would wait for the device every step.
    A validation or test that reads several loaders gets `self.log`'s mean per loader instead.
    """

    def __init__(self) -> None:
        super().__init__()
        # ModuleDict keys may not contain dots; names may (module names).
        self.means = nn.ModuleDict()

    def log(
        self, module: Any, name: str, value: Tensor, batch_size: int, prog_bar: bool = False
    ) -> None:
        """Add `value`, the mean over a batch of `batch_size`, to `name`'s mean for this epoch.

        `module` is the LightningModule that holds this object as an attribute and runs the
        step; `prog_bar` shows the mean in the progress bar after the epoch, as `self.log`'s.
        """
        if evaluation_loaders(module) > 1:
            # One object per name would mix the loaders; self.log keeps a mean per loader.
            module.log(
                name,
                value,
                prog_bar=prog_bar,
                on_step=False,
                on_epoch=True,
                sync_dist=True,
                batch_size=batch_size,
            )
            return
        key = name.replace(".", "\N{MIDDLE DOT}")
        if key not in self.means:
            # "disable": no NaN check, which would wait for the device at every update. It
            # also drops the weights (torchmetrics 1.9), hence a value per sample (a view).
            self.means[key] = MeanMetric(nan_strategy="disable").to(value.device)
        mean = self.means[key]
        mean.update(value.detach().expand(batch_size))
        if not module_holds_for_this_epoch(module, [name]):
            # metric_attribute: Lightning records where the metric lives; it finds it on its
            # own only among the module's metrics as they were at the first logged metric.
            attribute = next(path for path, child in module.named_modules() if child is mean)
            module.log(
                name,
                mean,
                prog_bar=prog_bar,
                on_step=False,
                on_epoch=True,
                metric_attribute=attribute,
            )


class OnLoggingSteps(Metric):
    """`metric`, updated on the training steps that write to the loggers (see `log_metrics`)
    with the inputs of every step since the last one, and when computed (at the end of an
    epoch, of a validation or test run): its value is the same.

    A classification metric's update waits for the device: torchmetrics counts with
    `torch.bincount`, whose output CUDA sizes by reading its input's maximum back. Holding
    the inputs (detached, not copied) moves that wait to the steps that already wait for the
    logged values. The held inputs are applied early when they pass `HELD_BYTES`.
    """

    full_state_update = False

    def __init__(self, metric: Metric) -> None:
        super().__init__()
        self.metric = metric
        self.held: list[tuple[Tensor, ...]] = []
        self.held_bytes = 0

    @property
    def higher_is_better(self) -> bool | None:  # type: ignore[override]
        """The metric's: --monitor and the runs table read which way a metric is better."""
        return self.metric.higher_is_better

    def update(self, *inputs: Tensor) -> None:
        self.held.append(tuple(value.detach() for value in inputs))
        self.held_bytes += sum(value.nbytes for value in inputs)
        if self.held_bytes > HELD_BYTES:
            self.apply_held()

    def apply_held(self) -> None:
        """Update the metric with every input held (one update, the steps' batches joined)."""
        if self.held:
            held, self.held, self.held_bytes = self.held, [], 0
            self.metric.update(*(torch.cat(values) for values in zip(*held, strict=True)))

    def forward(self, *inputs: Tensor) -> Any:
        # A batch's value is what holding the inputs avoids: say so rather than wait.
        raise TypeError(
            f"{type(self.metric).__name__} is updated on the logging steps only "
            "(kit.metrics.on_logging_steps): call update(preds, target), or make it without "
            "on_logging_steps for a value at every step"
        )

    def compute(self) -> Any:
        self.apply_held()
        return self.metric.compute()

    def reset(self) -> None:
        super().reset()
        self.held, self.held_bytes = [], 0
        self.metric.reset()


def on_logging_steps(metrics: MetricCollection) -> MetricCollection:
    """The same collection (names, prefix), each metric updated on the logging steps only."""
    return MetricCollection(
        {name: OnLoggingSteps(metric) for name, metric in metrics.items(keep_base=True)},
        prefix=metrics.prefix,
        postfix=metrics.postfix,
    )


def log_metrics(
    module: Any, metrics: MetricCollection, *inputs: Tensor, prog_bar: bool = True
) -> None:
    """Update `metrics` with a step's inputs (`preds, target`) and log the metric objects
    themselves, once an epoch (a validation or test run), from `module`'s step.

    Lightning keeps a logged metric object, computes it at the epoch's end on every process
    at the same point (computing gathers every process's counts) and resets it; logging it
    again at each step would only cost a `self.log` call's Python work. Computing them in an
    epoch-end hook of the module instead would put that gather after the progress bar's own
    sync on the first process only: a deadlock. Metrics made by `on_logging_steps` are
    updated here on the training steps that write to the loggers (and when computed).
    """
    metrics.update(*inputs)
    if module_logs_this_step(module):
        for metric in metrics.values():
            if isinstance(metric, OnLoggingSteps):
                metric.apply_held()
    if not module_holds_for_this_epoch(module, metrics.keys()):
        module.log_dict(metrics, prog_bar=prog_bar, on_step=False, on_epoch=True)
