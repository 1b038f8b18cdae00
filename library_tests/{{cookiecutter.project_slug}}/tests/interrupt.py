"""Callbacks for the reliability tests: stop a training process the hard way at a chosen step."""

import os
import signal

import lightning as L
import torch
from fsspec.implementations.local import LocalFileOpener
from lightning.pytorch.callbacks import ModelCheckpoint


class SignalAtStep(L.Callback):
    """Sends the signal called `name` (SIGKILL, SIGTERM, SIGUSR1) to itself after `step` steps.

    Checkpoint callbacks run after this one, so a step-interval checkpoint due at the
    same step is not written: the kill lands between two checkpoints.
    """

    def __init__(self, step: int, name: str = "SIGKILL", rank: int = 0) -> None:
        self.step = step
        self.signal = getattr(signal, name)
        self.rank = rank

    def on_train_batch_end(self, trainer: L.Trainer, *_: object) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), self.signal)


class RaiseAtStep(L.Callback):
    """Raises in one process of a multi-process run after `step` steps."""

    def __init__(self, step: int, rank: int) -> None:
        self.step = step
        self.rank = rank

    def on_train_batch_end(self, trainer: L.Trainer, *_: object) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            raise RuntimeError(f"injected failure on rank {self.rank} at step {self.step}")


class KillDuringCheckpointWrite(L.Callback):
    """SIGKILLs this process halfway through writing the first checkpoint after `step` steps."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save_checkpoint(self, trainer: L.Trainer, *_: object) -> None:
        if trainer.global_step < self.step:
            return
        write = LocalFileOpener.write

        def write_half_then_die(opener: LocalFileOpener, data: bytes) -> int:
            write(opener, data[: len(data) // 2])
            opener.flush()
            os.kill(os.getpid(), signal.SIGKILL)
            return 0

        LocalFileOpener.write = write_half_then_die


class CollectiveOnOneRank(L.Callback):
    """After `step` steps, one process enters an all_reduce that the others never call."""

    def __init__(self, step: int, rank: int) -> None:
        self.step = step
        self.rank = rank

    def on_train_batch_end(self, trainer: L.Trainer, *_: object) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            print(f"rank {self.rank} enters an all_reduce alone", flush=True)
            torch.distributed.all_reduce(torch.ones(1))


class GatherAfterTheBar(ModelCheckpoint):
    """A checkpoint callback that gathers a value from every process when an epoch ends.

    Lightning runs checkpoint callbacks after the progress bar, like a model's own
    `on_train_epoch_end`: a collective there is where rank 0 and the others part if only
    rank 0's bar computes the epoch's metrics.
    """

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        gathered = pl_module.all_gather(torch.tensor(float(trainer.global_rank)))
        print(f"rank {trainer.global_rank} gathered {gathered.tolist()}", flush=True)
