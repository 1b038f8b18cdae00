"""The W&B logger: an offline run written under runs/wandb/, with no account and no network."""

from collections.abc import Callable
from pathlib import Path

import pytest
import wandb

RUN = Path("runs/default/version_0")


@pytest.fixture(autouse=True)
def fresh_wandb_service() -> None:
    # W&B's background service resolves the relative runs/wandb against the folder it started
    # in; these tests each train in a folder of their own, so each gets a service of its own.
    wandb.teardown()


def test_an_offline_wandb_run_is_written_next_to_the_run_folder(train: Callable) -> None:
    train()
    (offline,) = Path("runs/wandb").glob("offline-run-*")
    (history,) = offline.glob("run-*.wandb")
    assert history.stat().st_size > 0
    assert (RUN / "metrics.csv").is_file() and (RUN / "checkpoints" / "last.ckpt").is_file()


def test_each_run_in_one_process_gets_its_own_wandb_run(train: Callable) -> None:
    # Sweep trials run one after another in one process; none may log into another's run.
    train()
    train()
    assert len(list(Path("runs/wandb").glob("offline-run-*"))) == 2
    assert sorted(p.name for p in Path("runs/default").iterdir()) == ["version_0", "version_1"]
