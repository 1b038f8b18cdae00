"""The W&B logger: an offline run written under runs/wandb/, with no account and no network."""

from collections.abc import Callable
from pathlib import Path

import pytest
import wandb

RUN = Path("runs/default/version_0")


@pytest.fixture(autouse=True)
def no_run_in_progress() -> None:
    # WandbLogger reuses a run still open in this process (the other tests' runs are).
    wandb.finish()


def test_an_offline_wandb_run_is_written_next_to_the_run_folder(train: Callable) -> None:
    train()
    (offline,) = Path("runs/wandb").glob("offline-run-*")
    (history,) = offline.glob("run-*.wandb")
    assert history.stat().st_size > 0
    assert (RUN / "metrics.csv").is_file() and (RUN / "checkpoints" / "last.ckpt").is_file()
