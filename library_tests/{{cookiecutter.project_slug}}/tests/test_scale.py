"""Scaling out on CPU: processes agree on metrics, precision, compile.

test_user_paths.py runs every launcher the README shows as it shows it.
"""

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_train import RUN

from {{ cookiecutter.package_name }}.kit.gpu_check import samples_per_second
from {{ cookiecutter.package_name }}.model import ImageClassifier

PROJECT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
# One short epoch per process, and every process reports its val/acc.
LAUNCH = [
    "--accelerator", "cpu",
    "--max_epochs", "1",
    "--trainer.limit_train_batches", "2",
    "--trainer.limit_val_batches", "2",
    "--trainer.limit_test_batches", "1",
    "--trainer.enable_progress_bar", "false",
    "--trainer.callbacks+=rank_report.PrintValAcc",
]  # fmt: skip


def launch_env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def val_accs(output: str) -> dict[int, str]:
    """The last val/acc each rank printed."""
    return {int(rank): acc for rank, acc in re.findall(r"rank=(\d+) val/acc=([\d.]+)", output)}


def assert_one_run_folder(tmp_path: Path) -> None:
    assert [p.name for p in (tmp_path / "runs" / "default").iterdir()] == ["version_0"]
    assert (tmp_path / RUN / "config.yaml").is_file()
    assert (tmp_path / RUN / "test_metrics.json").is_file()


def test_effective_batch_size_is_reported(
    train: Callable, caplog: pytest.LogCaptureFixture
) -> None:
    train("--max_epochs", "1", "--trainer.accumulate_grad_batches", "2")
    assert "Effective batch size: 32 = 16 per device x 1 device(s) x 1 node(s) x 2" in caplog.text


def test_bf16_mixed_precision_trains_on_cpu(train: Callable) -> None:
    metrics = train("--precision", "bf16-mixed")
    assert torch.isfinite(torch.tensor(metrics["test/loss"]))
    saved = torch.load(RUN / "checkpoints" / "last.ckpt", weights_only=True)
    assert all(
        t.dtype == torch.float32 for t in saved["state_dict"].values() if t.is_floating_point()
    )


def test_compiled_and_plain_models_share_checkpoints(make_datamodule: Callable) -> None:
    dm = make_datamodule()
    plain = ImageClassifier(dm.num_classes, dm.input_shape)
    compiled = ImageClassifier(dm.num_classes, dm.input_shape, compile=True)
    assert list(plain.state_dict()) == list(compiled.state_dict())
    compiled.load_state_dict(plain.state_dict())
    plain.load_state_dict(compiled.state_dict())


@pytest.mark.slow
def test_compiled_backbone_trains(train: Callable) -> None:
    metrics = train("--model.compile", "true", "--max_epochs", "1")
    assert 0.0 <= metrics["test/acc"] <= 1.0
    saved = torch.load(RUN / "checkpoints" / "last.ckpt", weights_only=True)
    assert not any("_orig_mod" in key for key in saved["state_dict"])


@pytest.mark.slow
def test_gpu_check_exits_cleanly_without_a_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: run scripts/gpu_check.sh to measure it")
    result = subprocess.run(
        ["bash", str(PROJECT / "scripts" / "gpu_check.sh")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0
    assert "no CUDA GPU" in result.stdout


def test_gpu_checks_measure_runs_the_configured_model_and_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the GPU check times, on this machine's CPU: the project's default model and data,
    trained for a few steps (no run folder, no checkpoint)."""
    monkeypatch.chdir(tmp_path)
    rate = samples_per_second("32-true", steps=4, batch_size=8, accelerator="cpu")
    assert rate > 0
    assert not (tmp_path / "runs").exists()


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(
        command, cwd=cwd, env=launch_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


@pytest.mark.slow
def test_processes_agree_on_the_metrics_gathered_from_all_of_them(
    train_command: list[str], data_args: list[str], tmp_path: Path
) -> None:
    command = torchrun("--standalone", "--nproc_per_node", "2", *train_command[1:])
    result = run([*command, "--devices", "2", *LAUNCH, *data_args], tmp_path)
    accs = val_accs(result.stdout)
    assert set(accs) == {0, 1} and accs[0] == accs[1]
    assert_one_run_folder(tmp_path)
