"""Epoch means of per-step values (a loss, its terms), logged through Lightning once an epoch."""

from typing import Any

from torch import Tensor, nn
from torchmetrics.aggregation import MeanMetric

from .compat import evaluation_loaders, module_holds_for_this_epoch


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
