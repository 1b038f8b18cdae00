"""Fixtures shared by the tests: tiny data on disk and short training runs in a temp folder."""

import importlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch import Callback

from {{ cookiecutter.package_name }}.kit.datamodule import ImageDataModule
from {{ cookiecutter.package_name }}.kit.project import use
from {{ cookiecutter.package_name }}.kit.train import main
from {{ cookiecutter.package_name }}.project import project

use(project)  # as the entry scripts do: the library's functions called here build this model

# The tests' networks and batches are tiny: one torch thread runs them fastest, and threads
# that wait on each other slow to a crawl when other work shares the cores. In this process
# only: the commands the tests start (tests/test_runs.py) run with torch's default, as yours do.
torch.set_num_threads(1)

# fake_data.py provides the data_args and train_command fixtures for this dataset.
pytest_plugins = ["fake_data"]

# Test-only flags, for speed: small, quiet, single-process runs; each test adds what it
# checks. They are never the only coverage of a default: tests/test_runs.py runs
# `python train.py` with the default bar, workers, callbacks and loggers.
FAST = [
    "--accelerator", "cpu",
    "--devices", "1",
    "--max_epochs", "2",
    "--data.batch_size", "16",
    "--data.num_workers", "0",
    "--trainer.limit_train_batches", "4",
    "--trainer.limit_val_batches", "2",
    "--trainer.limit_test_batches", "2",
    "--trainer.log_every_n_steps", "1",
    "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false",
]  # fmt: skip


@pytest.fixture(autouse=True)
def environment_kept() -> Iterator[None]:
    """Each test leaves the environment as it found it. A DDP fit in this process leaves
    LOCAL_RANK, MASTER_PORT, ... set (Lightning's launcher); a later test's two-process command
    would inherit them, take its ranks for started by someone else and wait for rank 1."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session", autouse=True)
def own_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """What runs remember between starts (the image check) goes to a temp folder, not ~/.cache."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def caplog(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> pytest.LogCaptureFixture:
    """pytest's caplog, seeing Lightning's messages too (rank_zero_info: the epoch lines).

    Lightning's logger stops propagating to the root logger when the root has no handler at
    import time. pytest before 9.2 attaches caplog to the root logger only: it saw nothing.
    """
    monkeypatch.setattr(logging.getLogger("lightning.pytorch"), "propagate", True)
    return caplog


@pytest.fixture
def train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data_args: list[str]) -> Callable:
    """Run `train.py` in-process inside tmp_path with FAST settings plus the given args."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str, callbacks: Sequence[Callback] = ()) -> dict[str, float]:
        return main([*FAST, *data_args, *args], callbacks=callbacks)

    return run


@pytest.fixture
def command(train_command: list[str], data_args: list[str]) -> Callable[..., list[str]]:
    """Build the command line that runs training in a subprocess with FAST settings."""

    def build(*args: str) -> list[str]:
        return [*train_command, *FAST, *data_args, *args]

    return build


# What `python train.py` trains on by default: configs/default.yaml's data module and its
# arguments. Make another class the default there and these tests check it (with the test data
# tests/fake_data.py writes for it).
DEFAULTS = yaml.safe_load((Path(__file__).parents[1] / "configs" / "default.yaml").read_text())


@pytest.fixture
def make_datamodule(data_args: list[str]) -> Callable[..., ImageDataModule]:
    """Build the default data module with the same --data.* arguments the CLI tests use;
    make_datamodule(SomeClass) builds another (the test data's arguments apply to the default)."""
    module, name = DEFAULTS["data"]["class_path"].rsplit(".", 1)
    default = getattr(importlib.import_module(module), name)
    given = {
        key.removeprefix("--data."): value
        for key, value in zip(data_args[::2], data_args[1::2], strict=True)
    }
    given = {key: int(value) if value.isdigit() else value for key, value in given.items()}
    configured = {**(DEFAULTS["data"].get("init_args") or {}), "batch_size": 8, "num_workers": 0}

    def make(cls: type | None = None, **overrides: object) -> ImageDataModule:
        if cls is None or cls is default:
            return default(**{**configured, **given, **overrides})
        return cls(**{"batch_size": 8, "num_workers": 0, **overrides})

    return make


@pytest.fixture
def defaults() -> dict:
    """configs/default.yaml, as a dict."""
    return DEFAULTS


@pytest.fixture
def monitored() -> str:
    """The metric configs/default.yaml monitors: it picks the best checkpoint, stops early."""
    return DEFAULTS["monitor"]
