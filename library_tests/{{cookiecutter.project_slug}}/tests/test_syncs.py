"""What makes the host wait for the device in a default training step: nothing from the model
or the default callbacks, except on the steps that log (every log_every_n_steps).

Counted on the CPU by tests/syncs.py, in one process and in two (DDP), with every default
callback and the default progress bar; loaders without workers, which never touch the device.
"""

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from test_reliability import run

# Tensors that stay on the host in a GPU run too: the optimizers' step counters, the loader's.
HOST_SIDE = ("/torch/optim/", "/torch/utils/data/", "/torchdata/")
# Lightning's training loop broadcasts from the first process whether it got SIGTERM, and
# reads it, at every step of a run of several processes: the loop's own, not a callback's.
LIGHTNING_LOOP = "/lightning/pytorch/loops/training_epoch_loop.py:"
STEPS = ["--max_epochs", "1", "--trainer.limit_train_batches", "7"]
# Steps 2 and 5 log; the bar is on, as by default (the test settings turn it off).
SHOWN = ["--trainer.log_every_n_steps", "3", "--trainer.enable_progress_bar", "true"]


def counted(command: Callable, tmp_path: Path, *args: str) -> list[dict]:
    """Train with the counter; each process's {"synced": {step: [...]}, "logging_steps"}."""
    out = tmp_path / "syncs"
    counter = [
        "--trainer.callbacks+=syncs.CountSyncs",
        "--trainer.callbacks.init_args.out",
        str(out),
    ]
    result = run(command(*STEPS, *SHOWN, *args, *counter), tmp_path, timeout=240)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    reports = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("syncs.rank*.json"))]
    for report in reports:
        report["synced"] = {
            int(step): [s for s in synced if not any(part in s for part in HOST_SIDE)]
            for step, synced in report["synced"].items()
        }
    return reports


def check(reports: list[dict], loop_syncs: int) -> None:
    for report in reports:
        assert report["logging_steps"] == [2, 5]
        for step in range(7):
            synced = report["synced"].get(step, [])
            if step in report["logging_steps"]:
                # The divergence check reads what it noted since the last logging step; the
                # training metrics count the predictions they held (torch.bincount); the
                # first process's bar reads train/loss_step.
                assert any("/kit/guards.py:" in s for s in synced), synced
                assert any(s.startswith("bincount at ") for s in synced), synced
                assert report is not reports[0] or any("/kit/callbacks.py:" in s for s in synced)
                continue
            ours = [s for s in synced if LIGHTNING_LOOP not in s]
            assert ours == [], f"step {step} waits for the device: {ours}"
            assert len(synced) <= loop_syncs, synced


def test_a_default_step_makes_the_host_wait_only_when_it_logs(
    command: Callable, tmp_path: Path
) -> None:
    (report,) = counted(command, tmp_path)
    check([report], loop_syncs=0)


@pytest.mark.slow
def test_a_default_step_of_two_processes_makes_them_wait_only_when_it_logs(
    command: Callable, tmp_path: Path
) -> None:
    reports = counted(command, tmp_path, "--devices", "2", "--strategy", "ddp")
    assert len(reports) == 2
    check(reports, loop_syncs=2)
