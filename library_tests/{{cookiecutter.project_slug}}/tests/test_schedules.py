"""The default learning-rate schedule (kit/schedules.py), on its own: a model's use of it, and
the note a short schedule gives, are tested with the model (the project's tests/test_model.py)."""

from itertools import pairwise

import pytest
import torch
from torch import nn

from {{ cookiecutter.package_name }}.kit.schedules import warmup_cosine, warmup_steps


def test_warmup_then_cosine_decay() -> None:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = warmup_cosine(optimizer, total_steps=100, warmup_fraction=0.1)
    lrs = []
    for _ in range(100):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(0.01)
    assert lrs[10] == pytest.approx(1.0)
    assert all(a < b for a, b in pairwise(lrs[:11]))  # rising during warmup
    assert all(a >= b for a, b in pairwise(lrs[10:]))  # falling afterwards
    assert lrs[-1] < 0.01


@pytest.mark.parametrize(("total", "expected"), [(1, 1), (2, 1), (18, 1), (100, 5), (1000, 50)])
def test_warmup_is_at_least_one_step_and_leaves_one_to_decay(total: int, expected: int) -> None:
    assert warmup_steps(total, 0.05) == expected
