"""The private parts of libraries that compat.py touches are still where it expects them."""

from datetime import timedelta

import pytest
import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.strategies import ddp as ddp_module

from {{ cookiecutter.package_name }}.compat import set_collective_timeout


def test_the_collective_timeout_reaches_the_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    strategy = DDPStrategy(
        accelerator=CPUAccelerator(),
        parallel_devices=[torch.device("cpu")],
        cluster_environment=LightningEnvironment(),
    )
    assert set_collective_timeout(strategy, 12.5)
    given = {}
    connect = lambda *_, **kwargs: given.update(kwargs)  # noqa: E731
    monkeypatch.setattr(ddp_module, "_init_dist_connection", connect)
    strategy.setup_distributed()
    assert given["timeout"] == timedelta(seconds=12.5)


def test_a_single_device_has_no_collective_timeout() -> None:
    assert not set_collective_timeout(SingleDeviceStrategy(torch.device("cpu")), 12.5)
