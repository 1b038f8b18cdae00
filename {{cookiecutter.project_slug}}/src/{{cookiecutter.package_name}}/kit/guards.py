"""Callbacks that keep a run recoverable: exact RNG state, divergence stop, preemption save."""

import random
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from .errors import DivergedError


class RngState(L.Callback):
    """Stores the Python, NumPy and torch RNG states in every checkpoint and restores them.

    With the data loader's own state (its sampler's generator and position), this makes a
    resumed run draw the same dropout masks and augmentations as one that never stopped.
    Everything is stored as plain data, so checkpoints still load with weights_only=True.
    """

    def state_dict(self) -> dict[str, Any]:
        version, mt_state, position, has_gauss, gauss = np.random.get_state()
        # int64, because torch before 2.4 cannot save a uint32 tensor.
        mt_state = torch.from_numpy(mt_state.astype(np.int64))
        state = {
            "python": random.getstate(),
            "numpy": [version, mt_state, position, has_gauss, gauss],
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        random.setstate(state_dict["python"])
        version, mt_state, position, has_gauss, gauss = state_dict["numpy"]
        mt_state = mt_state.numpy().astype(np.uint32)
        np.random.set_state((version, mt_state, position, has_gauss, gauss))
        torch.set_rng_state(state_dict["torch"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])


class StopOnDivergence(L.Callback):
    """Stops at the first step whose loss is NaN or infinite, before it reaches a checkpoint.

    The check runs before the checkpoint callbacks (Lightning runs those last) and again
    on every checkpoint about to be written, so the newest checkpoint on disk is a good one.
    """

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        diverged = loss is not None and not bool(torch.isfinite(loss).all())
        # Each process has its own loss; all stop if any diverged, or the others would wait
        # in the next step's gradient sync for the one that stopped.
        if trainer.strategy.reduce_boolean_decision(diverged, all=False):
            raise DivergedError(
                f"train/loss became {describe(loss)} at step {trainer.global_step} "
                f"(epoch {trainer.current_epoch}, batch {idx})"
            )

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        for name, tensor in checkpoint["state_dict"].items():
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise DivergedError(
                    f"weight {name} is not finite after step {trainer.global_step}; "
                    "the checkpoint was not written"
                )


def describe(loss: torch.Tensor | None) -> str:
    """The loss of this process as a number, or what it was on the process that diverged."""
    if loss is None or bool(torch.isfinite(loss).all()):
        return "not finite on another process"
    return str(loss.item())


class SaveOnPreemption(L.Callback):
    """On SIGTERM (and SIGUSR1, which the CLI turns into SIGTERM) saves `last.ckpt` and stops.

    Lightning stops the loop at the next batch boundary on every rank; this writes the
    checkpoint that `--ckpt_path last` resumes from, losing no finished step.
    """

    def __init__(self) -> None:
        self.saved: Path | None = None

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # A SIGTERM sent to the whole process group can kill the loader workers first: the
        # loop then fails on a dead worker instead of stopping at the batch boundary.
        stopped = isinstance(exception, SIGTERMException) or trainer.received_sigterm
        if not stopped or trainer.state.fn != "fit":
            return
        last = next(
            (c for c in trainer.checkpoint_callbacks if getattr(c, "filename", None) == "last"),
            None,
        )
        if not isinstance(last, ModelCheckpoint) or last.dirpath is None:
            return
        self.saved = Path(last.dirpath) / f"last{last.FILE_EXTENSION}"
        trainer.save_checkpoint(self.saved, weights_only=False)  # the whole training state
        rank_zero_info(f"Saved {self.saved} at step {trainer.global_step} after SIGTERM")
