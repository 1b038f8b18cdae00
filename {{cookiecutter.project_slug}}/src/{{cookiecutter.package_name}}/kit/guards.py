"""Callbacks that keep a run recoverable: exact RNG state, divergence stop, preemption save;
Ctrl-C that stops a run wherever it comes."""

import random
import signal
import threading
import weakref
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from .compat import logs_this_step
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
    """Stops a run whose loss became NaN or infinite, before it reaches a checkpoint.

    Each step's loss is checked on the device, where the step left it; the host reads the
    result (which waits for the device, and with several processes takes a collective) only
    on the steps that log, every `log_every_n_steps`, at the end of each epoch, and before
    every checkpoint is written, which also checks the weights: the newest checkpoint on disk
    is a good one. The error names the first step whose loss was not finite. Lightning runs
    the checkpoint callbacks last, so a check at the same point comes before their save.
    """

    def __init__(self) -> None:
        # On the device: (the index of the last step recorded since the last check, that of
        # the first whose loss was not finite or -1, that loss); on the host: (step, epoch,
        # batch) of each recorded step.
        self.state: torch.Tensor | None = None
        self.steps: list[tuple[int, int, int]] = []

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None:
            self.record(loss.detach(), (trainer.global_step, trainer.current_epoch, idx))
        if logs_this_step(trainer):
            self.check(trainer, every_process=True)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer, every_process=True)

    def record(self, loss: torch.Tensor, where: tuple[int, int, int]) -> None:
        """Note this step's loss without waiting for it: tensor operations only."""
        if self.state is None:  # made on the device: a copy from the host would wait
            # float32: MPS has no float64; it counts the steps between two checks exactly.
            self.state = torch.full((3,), -1.0, dtype=torch.float32, device=loss.device)
        last, first, value = self.state.unbind()
        index = last + 1
        is_first = ~torch.isfinite(loss).all() & (first < 0)
        first = torch.where(is_first, index, first)
        value = torch.where(is_first, loss.float(), value)
        self.state = torch.stack([index, first, value])
        self.steps.append(where)

    def check(self, trainer: L.Trainer, every_process: bool) -> None:
        """Raise DivergedError if a recorded loss was not finite (on any process when
        `every_process`: all then stop, or the others would wait in the next gradient sync
        for the one that stopped; every process calls it at the same point)."""
        first, value = (-1, 0.0) if self.state is None else self.state[1:].tolist()
        diverged = first >= 0
        if every_process:
            diverged = trainer.strategy.reduce_boolean_decision(diverged, all=False)
        if diverged:
            if first >= 0:
                step, epoch, batch = self.steps[int(first)]
                raise DivergedError(
                    f"train/loss became {value} at step {step} (epoch {epoch}, batch {batch})"
                )
            raise DivergedError(
                f"train/loss became not finite on another process by step {trainer.global_step}"
            )
        self.state, self.steps = None, []

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self.check(trainer, every_process=False)  # every process may not save
        for name, tensor in checkpoint["state_dict"].items():
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise DivergedError(
                    f"weight {name} is not finite after step {trainer.global_step}; "
                    "the checkpoint was not written"
                )


# Ctrl-C came where its KeyboardInterrupt could not be raised (see `interrupt`).
INTERRUPTED = threading.Event()


def interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C, as Python's own handler: a KeyboardInterrupt where the main thread is.

    Python runs a signal handler wherever the main thread is, also in a finalizer (a loader
    shutting down its workers as an epoch or fit ends, say), where an exception is printed
    with its traceback and lost, and the run would go on. There it only marks the stop,
    which the next batch (`SaveOnPreemption`) or the end of fit or test turns into one.
    """
    INTERRUPTED.set()
    if not in_finalizer(frame):
        raise KeyboardInterrupt


def in_finalizer(frame: FrameType | None) -> bool:
    """Whether the code that `frame` runs was called by an object's `__del__` or a
    `weakref.finalize` callback: where an exception cannot leave."""
    while frame is not None:
        if frame.f_code.co_name == "__del__" or frame.f_code is weakref.finalize.__call__.__code__:
            return True
        frame = frame.f_back
    return False


def handle_interrupts() -> bool:
    """Make Ctrl-C stop the run wherever it comes (`interrupt`); whether it did. Python's own
    handler only is replaced: not where SIGINT is ignored (a job a script started in the
    background) or where the caller handles it itself."""
    INTERRUPTED.clear()
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False
    signal.signal(signal.SIGINT, interrupt)
    return True


class SaveOnPreemption(L.Callback):
    """On SIGTERM (and SIGUSR1, which the CLI turns into SIGTERM) saves `last.ckpt` and stops.

    Lightning stops the loop at the next batch boundary on every rank; this writes the
    checkpoint that `--ckpt_path last` resumes from, losing no finished step. A Ctrl-C that
    came in a finalizer stops the run at the next batch, as one anywhere else would.
    """

    def __init__(self) -> None:
        self.saved: Path | None = None

    def on_train_batch_start(self, *_: Any) -> None:
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt

    def on_validation_batch_start(self, *_: Any) -> None:
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt

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
