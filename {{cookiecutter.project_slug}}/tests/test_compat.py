"""The private parts of libraries that compat.py touches are still where it expects them."""

import csv
import warnings
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.strategies import ddp as ddp_module

from {{ cookiecutter.package_name }}.compat import AppendingCSVLogger, set_collective_timeout


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


def test_the_csv_logger_adds_to_the_metrics_of_a_run_folder(tmp_path: Path) -> None:
    """A resume or an evaluation logs into a run folder that has a metrics.csv already."""
    first = AppendingCSVLogger(tmp_path, name="default", version=0)
    first.log_metrics({"train/loss": 1.5}, step=0)
    first.save()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Lightning's writer warns, then deletes the file
        again = AppendingCSVLogger(tmp_path, name="default", version=0)
        again.log_metrics({"train/loss": 1.25}, step=1)
        again.log_metrics({"test/acc": 0.5}, step=2)  # a column the file does not have yet
        again.save()
    with open(tmp_path / "default" / "version_0" / "metrics.csv", newline="") as file:
        rows = [(row["step"], row["train/loss"], row["test/acc"]) for row in csv.DictReader(file)]
    assert rows == [("0", "1.5", ""), ("1", "1.25", ""), ("2", "", "0.5")]
