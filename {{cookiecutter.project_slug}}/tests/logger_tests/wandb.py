"""The W&B logger: an offline run written under runs/wandb/, with no account and no network."""

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.loggers import WandbLogger

RUN = Path("runs/default/version_0")


def test_an_offline_wandb_run_is_written_next_to_the_run_folder(
    command: Callable, tmp_path: Path
) -> None:
    # In a process of its own, as train.py runs, with a W&B service of its own: the service
    # writes the history relative to the folder it started in, and an earlier in-process run
    # of this session left its address in WANDB_SERVICE.
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_")}
    result = subprocess.run(
        command(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (offline,) = (tmp_path / "runs" / "wandb").glob("offline-run-*")
    (history,) = offline.glob("run-*.wandb")
    assert history.stat().st_size > 0
    assert (tmp_path / RUN / "metrics.csv").is_file()
    assert (tmp_path / RUN / "checkpoints" / "last.ckpt").is_file()


class WandbRunIds(L.Callback):
    """Records the W&B run each fit logs into."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.runs: list[object] = []

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        runs = [lg.experiment for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        self.ids += [run.id for run in runs]
        self.runs += runs


def test_each_run_in_one_process_gets_its_own_wandb_run(train: Callable) -> None:
    # Runs one after another in one process (tests, a search's trials) keep their logs apart.
    runs = WandbRunIds()
    train(callbacks=[runs])
    train(callbacks=[runs])
    assert len(runs.ids) == 2 and runs.ids[0] != runs.ids[1]


def test_hyperparameters_reach_the_wandb_config(train: Callable) -> None:
    runs = WandbRunIds()
    flags = ["--model.optimizer.init_args.lr", "0.003", "--seed_everything", "7"]
    train(*flags, callbacks=[runs])
    (run,) = runs.runs
    assert run.config["model.optimizer.init_args.lr"] == pytest.approx(0.003)
    assert run.config["seed_everything"] == 7
