"""The default learning-rate schedule: a linear warmup, then a cosine decay to zero, stepped
every optimizer step (torch's own schedulers, in sequence)."""

import math

from lightning.pytorch.utilities import rank_zero_info
from torch.optim import Optimizer
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, LRScheduler, SequentialLR

# Fewer optimizer steps than this leave the warmup and the cosine decay too little room to
# train well (2 epochs of 600 images: 18 steps, a test accuracy near chance): said at start.
SHORT_SCHEDULE = 100


def warmup_cosine(optimizer: Optimizer, total_steps: int, warmup_fraction: float) -> LRScheduler:
    """Linear warmup from 1% of the learning rate, then cosine decay to zero; a schedule of
    fewer than SHORT_SCHEDULE steps says so, once, on the first process (an info line)."""
    warmup = warmup_steps(total_steps, warmup_fraction)
    if total_steps < SHORT_SCHEDULE:
        rank_zero_info(short_schedule_note(total_steps, warmup_fraction))
    return SequentialLR(
        optimizer,
        schedulers=[
            LinearLR(optimizer, start_factor=0.01, total_iters=warmup),
            CosineAnnealingLR(optimizer, T_max=max(1, total_steps - warmup)),
        ],
        milestones=[warmup],
    )


def warmup_steps(total_steps: int, warmup_fraction: float) -> int:
    return min(max(1, math.ceil(total_steps * warmup_fraction)), max(1, total_steps - 1))


def short_schedule_note(total_steps: int, warmup_fraction: float) -> str:
    warmup = warmup_steps(total_steps, warmup_fraction)
    return (
        f"the learning rate warms up for {warmup} and decays to zero over only {total_steps} "
        f"optimizer steps (fewer than {SHORT_SCHEDULE}): train longer (--max_epochs), use "
        "smaller batches (--data.batch_size) or a constant rate (--model.scheduler)"
    )
