"""The default learning-rate schedule (kit/schedules.py), on its own: a model's use of it, and
the note a short schedule gives, are tested with the model (the project's tests/test_model.py)."""

import math
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


def test_a_schedule_resumed_with_more_steps_follows_the_longer_cosine_down_to_zero() -> None:
    weight = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    first = warmup_cosine(optimizer, total_steps=100, warmup_fraction=0.1)  # warmup: 10 steps
    for _ in range(60):
        optimizer.step()
        first.step()
    # Resumed at step 60 with 200 steps planned: the warmup stays 10 steps, the cosine runs
    # over the other 190, as a run planned for 200 from the start would have it from here.
    saved, saved_optimizer = first.state_dict(), optimizer.state_dict()
    optimizer = torch.optim.SGD([weight], lr=1.0)
    resumed = warmup_cosine(optimizer, total_steps=200, warmup_fraction=0.1)
    optimizer.load_state_dict(saved_optimizer)
    resumed.load_state_dict(saved)
    lrs = []
    for _ in range(140):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        resumed.step()
    expected = [(1 + math.cos(math.pi * step / 190)) / 2 for step in range(50, 190)]
    assert lrs == pytest.approx(expected, abs=1e-6)
    assert resumed.state_dict()["total_steps"] == 200  # what a second resume compares with
    # The same total as planned: nothing changes.
    again = warmup_cosine(torch.optim.SGD([weight], lr=1.0), total_steps=100, warmup_fraction=0.1)
    again.load_state_dict(saved)
    assert again.state_dict() == saved
