"""Kills, signals, divergence and failing processes: what survives and what the user is told."""

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
RUN = Path("runs/default")
# Short epochs (5 steps) with a checkpoint every 3 steps, so kills land mid-epoch.
EXACT = [
    "--trainer.deterministic", "true",
    "--max_epochs", "3",
    "--trainer.limit_train_batches", "5",
    "--step_checkpoint.every_n_train_steps", "3",
]  # fmt: skip


def run(command: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a training subprocess that can import the callbacks in tests/interrupt.py."""
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def with_callback(callback: str, **init_args: object) -> list[str]:
    args = [f"--trainer.callbacks+=interrupt.{callback}"]
    for key, value in init_args.items():
        args += [f"--trainer.callbacks.init_args.{key}", str(value)]
    return args


def saved_step(run_folder: Path) -> int:
    return torch.load(run_folder / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]


def test_sigkill_mid_epoch_then_resume_matches_an_uninterrupted_run(
    train: Callable, command: Callable, tmp_path: Path
) -> None:
    uninterrupted = train(*EXACT)

    killed = run(command(*EXACT, *with_callback("SignalAtStep", step=7)), cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert saved_step(RUN / "version_1") == 6  # killed at step 7: one step lost, at most 3

    resumed = train(*EXACT, "--ckpt_path", "last")
    assert resumed == uninterrupted  # same test metrics, to the last bit
    reference = torch.load(RUN / "version_0/checkpoints/last.ckpt", weights_only=True)
    final = torch.load(RUN / "version_1/checkpoints/last.ckpt", weights_only=True)
    assert final["global_step"] == reference["global_step"] == 15
    for name, tensor in reference["state_dict"].items():
        assert torch.equal(final["state_dict"][name], tensor), name


def test_a_kill_while_writing_a_checkpoint_leaves_the_previous_one_intact(
    command: Callable, tmp_path: Path
) -> None:
    killed = run(command(*EXACT, *with_callback("KillDuringCheckpointWrite", step=6)), tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    # The write after step 6 died halfway; last.ckpt is still the complete one of step 5.
    assert saved_step(tmp_path / RUN / "version_0") == 5


@pytest.mark.parametrize("name", ["SIGTERM", "SIGUSR1"])
def test_preemption_signal_saves_a_checkpoint_and_exits_cleanly(
    name: str, train: Callable, command: Callable, tmp_path: Path
) -> None:
    stopped = run(command(*EXACT, *with_callback("SignalAtStep", step=4, name=name)), tmp_path)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    assert "Traceback" not in stopped.stderr
    assert "Stopped by a signal at step 4" in stopped.stdout
    assert saved_step(tmp_path / RUN / "version_0") == 4  # no finished step lost

    resumed = train(*EXACT, "--ckpt_path", "last")
    assert saved_step(RUN / "version_0") == 15
    assert 0.0 <= resumed["test/acc"] <= 1.0


def test_a_diverging_run_stops_with_the_step_and_keeps_a_good_checkpoint(train: Callable) -> None:
    with pytest.raises(SystemExit) as stop:
        train(
            "--max_epochs", "4",
            "--model.optimizer", "SGD",
            "--model.optimizer.lr", "1e12",
            "--step_checkpoint.every_n_train_steps", "1",
        )  # fmt: skip
    message = str(stop.value.code)
    assert message.startswith("error: training diverged: train/loss became")
    assert "at step" in message and "last good checkpoint:" in message
    kept = Path(message.rsplit("last good checkpoint: ", 1)[1])
    state = torch.load(kept, weights_only=True)["state_dict"]
    assert all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point())


@pytest.mark.slow
def test_a_failing_rank_stops_every_process(command: Callable, tmp_path: Path) -> None:
    args = ["--devices", "2", "--strategy", "ddp", "--max_epochs", "1"]
    failed = run(command(*args, *with_callback("RaiseAtStep", step=2, rank=1)), tmp_path)
    assert failed.returncode != 0
    assert "injected failure on rank 1 at step 2" in failed.stderr


def test_a_new_run_never_overwrites_an_old_one(train: Callable) -> None:
    first = train("--max_epochs", "1")
    second = train("--max_epochs", "1", "--model.optimizer.lr", "0.01")
    assert sorted(p.name for p in RUN.iterdir()) == ["version_0", "version_1"]
    for version, metrics in (("version_0", first), ("version_1", second)):
        saved = json.loads((RUN / version / "test_metrics.json").read_text())
        assert saved["test/acc"] == pytest.approx(metrics["test/acc"])
