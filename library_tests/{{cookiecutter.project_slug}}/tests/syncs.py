"""A callback for the sync tests: counts what would make the host wait for the device in each
training step (a tensor read as a Python number or truth value, a collective across processes,
an operation whose output's size depends on the values, which CUDA reads back to allocate it).

On a GPU each of these stalls the queue of kernels; on the CPU they cost nothing, so they are
counted instead of timed. Only the training steps are counted, from one batch's start to the
next (the callbacks' hooks, the optimizer step and the loader included), not the validation
loop or the epoch's end. Each process writes {step: [what synced, ...]} for the steps that
synced, and which steps wrote to the loggers, to `<out>.rank<N>.json`.
"""

import json
import traceback
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed

from {{ cookiecutter.package_name }}.kit.compat import logs_this_step

CONVERSIONS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")
# On CUDA these read values back to size their output (bincount its input's minimum and
# maximum), whatever calls them: torchmetrics' classification updates call the first two.
SIZED_BY_VALUES = (
    "bincount", "unique", "unique_consecutive", "nonzero", "argwhere", "masked_select",
)  # fmt: skip
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "broadcast", "barrier", "gather")


class CountSyncs(L.Callback):
    """Counts syncs per training step; must come first among the callbacks, which
    `--trainer.callbacks+=syncs.CountSyncs` on the command line makes it (given ones first)."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.step: int | None = None
        self.synced: dict[int, list[str]] = {}
        self.logging_steps: list[int] = []
        self.originals: list[tuple[Any, str, Any]] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for name in CONVERSIONS:
            self.wrap(torch.Tensor, name)
        for name in SIZED_BY_VALUES:
            self.wrap(torch, name)
            self.wrap(torch.Tensor, name)
        for name in COLLECTIVES:
            self.wrap(torch.distributed, name)

    def wrap(self, owner: Any, name: str) -> None:
        original = getattr(owner, name)
        counter = self

        def counted(*args: Any, **kwargs: Any) -> Any:
            if counter.step is not None:
                caller = traceback.extract_stack(limit=2)[0]
                where = f"{Path(caller.filename).as_posix()}:{caller.lineno}"
                counter.synced.setdefault(counter.step, []).append(f"{name} at {where}")
            return original(*args, **kwargs)

        self.originals.append((owner, name, original))
        setattr(owner, name, counted)

    def on_train_batch_start(self, trainer: L.Trainer, *_: Any) -> None:
        # Counted from here to the next batch's start, the optimizer step included.
        self.step = trainer.global_step
        if logs_this_step(trainer):  # this step writes to the loggers
            self.logging_steps.append(self.step)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.step = None

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.step = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.step = None
        for owner, name, original in reversed(self.originals):
            setattr(owner, name, original)
        report = {"synced": self.synced, "logging_steps": self.logging_steps}
        Path(f"{self.out}.rank{trainer.global_rank}.json").write_text(json.dumps(report))
