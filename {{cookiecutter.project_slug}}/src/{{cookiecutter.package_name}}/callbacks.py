"""Small callbacks the command line adds to every run."""

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor


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


def samples_in(batch: tuple[Tensor, Tensor]) -> int:
    """The number of samples in a batch (ThroughputMonitor's batch_size_fn)."""
    return len(batch[0])
