"""The default learning-rate schedule: a linear warmup, then a cosine decay to zero, stepped
every optimizer step (torch's own schedulers, in sequence)."""

import math
from typing import Any

from lightning.pytorch.utilities import rank_zero_info
from torch.optim import Optimizer
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, LRScheduler, SequentialLR

from .compat import scheduler_sequence

# Fewer optimizer steps than this leave the warmup and the cosine decay too little room to
# train well (2 epochs of 600 images: 18 steps, a test accuracy near chance): said at start.
SHORT_SCHEDULE = 100


class WarmupCosine(SequentialLR):
    """LinearLR, then CosineAnnealingLR to zero at `total_steps`.

    Restored from a checkpoint planned for another total (a run resumed with a higher
    --max_epochs), it keeps the warmup it had and stretches the cosine to end at zero at this
    total, going on from the step it reached: the rate falls from there instead of climbing
    back up (a cosine run past its end rises again).
    """

    def __init__(self, optimizer: Optimizer, total_steps: int, warmup_fraction: float) -> None:
        warmup = warmup_steps(total_steps, warmup_fraction)
        self.total_steps = total_steps
        super().__init__(
            optimizer,
            schedulers=[
                LinearLR(optimizer, start_factor=0.01, total_iters=warmup),
                CosineAnnealingLR(optimizer, T_max=max(1, total_steps - warmup)),
            ],
            milestones=[warmup],
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        total = self.total_steps
        super().load_state_dict(state_dict)  # the saved plan, total_steps included
        self.total_steps = total
        (_, cosine), (warmup,) = scheduler_sequence(self)
        planned = max(1, total - warmup)
        if cosine.T_max == planned:
            return
        cosine.T_max = planned
        if self.last_epoch >= warmup:  # decaying: this step's rate, on the stretched cosine
            done = min(cosine.last_epoch, planned)
            share = (1 + math.cos(math.pi * done / planned)) / 2
            for group, base in zip(self.optimizer.param_groups, cosine.base_lrs, strict=True):
                group["lr"] = cosine.eta_min + (base - cosine.eta_min) * share


def warmup_cosine(optimizer: Optimizer, total_steps: int, warmup_fraction: float) -> LRScheduler:
    """Linear warmup from 1% of the learning rate, then cosine decay to zero; a schedule of
    fewer than SHORT_SCHEDULE steps says so, once, on the first process (an info line)."""
    if total_steps < SHORT_SCHEDULE:
        rank_zero_info(short_schedule_note(total_steps, warmup_fraction))
    return WarmupCosine(optimizer, total_steps, warmup_fraction)


def warmup_steps(total_steps: int, warmup_fraction: float) -> int:
    return min(max(1, math.ceil(total_steps * warmup_fraction)), max(1, total_steps - 1))


def short_schedule_note(total_steps: int, warmup_fraction: float) -> str:
    warmup = warmup_steps(total_steps, warmup_fraction)
    return (
        f"the learning rate warms up over the first {warmup} of only {total_steps} optimizer "
        f"steps (fewer than {SHORT_SCHEDULE}), then decays to zero: train longer (--max_epochs), "
        "use smaller batches (--data.batch_size) or a constant rate (--model.scheduler)"
    )
