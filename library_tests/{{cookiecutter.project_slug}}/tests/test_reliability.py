"""Kills, signals, divergence and failing processes: what survives and what the user is told."""

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.strategies import DDPStrategy
from logged import scalars

from {{ cookiecutter.package_name }}.kit.cli import build_cli

TESTS = Path(__file__).resolve().parent
RUN = Path("runs/default")
# Short epochs (5 steps) with a checkpoint every 3 steps, so kills land mid-epoch.
EXACT = [
    "--trainer.deterministic", "true",
    "--max_epochs", "3",
    "--trainer.limit_train_batches", "5",
    "--step_checkpoint.every_n_train_steps", "3",
]  # fmt: skip


def run_env() -> dict[str, str]:
    """The environment of a training subprocess that imports tests/interrupt.py."""
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def run(command: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a training subprocess that can import the callbacks in tests/interrupt.py."""
    return subprocess.run(
        command, cwd=cwd, env=run_env(), capture_output=True, text=True, timeout=timeout
    )


def with_callback(callback: str, **init_args: object) -> list[str]:
    args = [f"--trainer.callbacks+=interrupt.{callback}"]
    for key, value in init_args.items():
        args += [f"--trainer.callbacks.init_args.{key}", str(value)]
    return args


def saved_step(run_folder: Path) -> int:
    return torch.load(run_folder / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]


# With an average of the weights (configs/model/ema.yaml), and killed while the backbone is
# frozen, with two learning rates (configs/model/finetune.yaml): each goes on exactly.
EMA = ["--ema", "lightning.pytorch.callbacks.EMAWeightAveraging", "--ema.decay", "0.9"]
FINETUNE = [
    "--model.backbone_lr_factor", "0.1",
    "--freeze_backbone", "{{ cookiecutter.package_name }}.kit.callbacks.FreezeBackbone",
    "--freeze_backbone.epochs", "2",
]  # fmt: skip


# Training metrics updated on the logging steps only: some steps' inputs are still held when
# the checkpoint is written.
HELD = ["--trainer.log_every_n_steps", "4"]


@pytest.mark.parametrize(
    "extra", [[], EMA, FINETUNE, HELD], ids=["default", "ema", "finetune", "held"]
)
def test_sigkill_mid_epoch_then_resume_matches_an_uninterrupted_run(
    train: Callable, command: Callable, tmp_path: Path, extra: list[str]
) -> None:
    uninterrupted = train(*EXACT, *extra)

    killed = run(command(*EXACT, *extra, *with_callback("SignalAtStep", step=7)), cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert saved_step(RUN / "version_1") == 6  # killed at step 7: one step lost, at most 3

    # The resume takes the killed run's config, without the callback that killed it.
    resumed = train(*EXACT, "--ckpt_path", "last", "--trainer.callbacks", "[]")
    assert resumed == uninterrupted  # same test metrics, to the last bit
    reference = torch.load(RUN / "version_0/checkpoints/last.ckpt", weights_only=True)
    final = torch.load(RUN / "version_1/checkpoints/last.ckpt", weights_only=True)
    assert final["global_step"] == reference["global_step"] == 15
    weights = ["state_dict", "current_model_state"] if extra == EMA else ["state_dict"]
    for key in weights:  # with EMA, state_dict is the average
        for name, tensor in reference[key].items():
            assert torch.equal(final[key][name], tensor), (key, name)
    rates = [
        [g["lr"] for g in c["optimizer_states"][0]["param_groups"]] for c in (reference, final)
    ]
    assert rates[0] == rates[1]  # the learning rate of each parameter group
    # The epoch that was cut (steps 5 to 9) and the next: their training metrics count every
    # step, those before the kill too. By step: the killed process's own logs may be missing,
    # or read after the resumed run's.
    for name in ("train/loss_epoch", "train/acc", "train/f1"):
        logged = [
            {step: value for step, value in scalars(RUN / version, name) if step >= 5}
            for version in ("version_0", "version_1")
        ]
        assert logged[0] == logged[1] and sorted(logged[0]) == [9, 14], (name, logged)


@pytest.mark.slow
def test_a_kill_while_writing_a_checkpoint_leaves_the_previous_one_intact(
    command: Callable, tmp_path: Path
) -> None:
    killed = run(command(*EXACT, *with_callback("KillDuringCheckpointWrite", step=6)), tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    # The write after step 6 died halfway; last.ckpt is still the complete one of step 5.
    assert saved_step(tmp_path / RUN / "version_0") == 5


class CtrlCInAFinalizer(L.Callback):
    """Ctrl-C while an object's finalizer runs, as when a loader shuts its workers down after
    the first validation of fit, or as fit ends."""

    def __init__(self, when: str) -> None:
        self.when, self.sent = when, False

    def send(self, trainer: L.Trainer, when: str) -> None:
        if self.when != when or self.sent or trainer.sanity_checking:
            return
        self.sent = True

        class Finalized:
            def __del__(self) -> None:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.5)  # the handler runs here, inside __del__

        Finalized()  # collected at once

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.send(trainer, "validation")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.send(trainer, "fit")


@pytest.mark.parametrize("when, step", [("validation", 4), ("fit", 8)])
def test_ctrl_c_in_a_finalizer_stops_the_run_as_anywhere_else(
    train: Callable, when: str, step: int, capsys: pytest.CaptureFixture
) -> None:
    """Its KeyboardInterrupt cannot leave the finalizer: the run stops at the next batch, or
    before the test, with Lightning's exit status for Ctrl-C."""
    with pytest.raises(SystemExit) as stopped:
        train("--trainer.limit_train_batches", "4", callbacks=[CtrlCInAFinalizer(when)])
    assert stopped.value.code == 1
    assert saved_step(RUN / "version_0") == step  # fit went no further
    assert not (RUN / "version_0" / "test_metrics.json").exists()  # no test ran
    assert "Exception ignored" not in capsys.readouterr().err


@pytest.mark.parametrize("name", ["SIGTERM", pytest.param("SIGUSR1", marks=pytest.mark.slow)])
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


def test_sigterm_to_the_process_group_stops_cleanly_with_loader_workers(
    command: Callable, tmp_path: Path
) -> None:
    """Schedulers and `kill -- -PGID` signal the loader workers too, and they may die while
    the main process waits for a batch: the run must still save and stop, not crash."""
    log = tmp_path / "output.txt"
    with log.open("w") as output:
        process = subprocess.Popen(
            command("--data.num_workers", "1", "--max_epochs", "1000"),
            cwd=tmp_path, env=run_env(), stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, without this test in it
        )  # fmt: skip
        deadline = time.monotonic() + 240
        while "Epoch 2/" not in log.read_text() and process.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(timeout=120) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    saved = re.search(r"Stopped by a signal at step (\d+)", text)
    assert saved, text[-3000:]
    assert saved_step(tmp_path / RUN / "version_0") == int(saved[1])


class NanLossFrom(L.Callback):
    """The model's loss is NaN from optimizer step `step` on."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *_: object
    ) -> None:
        if trainer.global_step == self.step:
            forward = pl_module.loss.forward
            pl_module.loss.forward = lambda *args: forward(*args) * float("nan")


def test_a_non_finite_loss_between_logging_steps_is_named_before_the_next_checkpoint(
    train: Callable,
) -> None:
    # The loss is checked on the device at every step and read when a step logs (none here)
    # or a checkpoint is about to be written (the epoch's, after step 7). Small batches: eight
    # of them in an epoch of any dataset's test data.
    with pytest.raises(SystemExit) as stop:
        train(
            "--max_epochs", "1",
            "--data.batch_size", "4",
            "--trainer.limit_train_batches", "8",
            "--trainer.log_every_n_steps", "50",
            "--step_checkpoint.every_n_train_steps", "4",
            callbacks=[NanLossFrom(5)],
        )  # fmt: skip
    message = str(stop.value.code)
    # Named by the first batch with a NaN loss (and the optimizer steps taken with it).
    assert message.startswith(
        "error: training diverged: train/loss became nan at step 6 (epoch 0, batch 5)"
    )
    assert message.endswith("last good checkpoint: runs/default/version_0/checkpoints/last.ckpt")
    assert saved_step(RUN / "version_0") == 4  # the step checkpoint before it, not the epoch's


def test_a_diverging_run_stops_with_the_step_and_keeps_a_good_checkpoint(train: Callable) -> None:
    with pytest.raises(SystemExit) as stop:
        train(
            "--max_epochs", "4",
            "--model.optimizer", "SGD",
            "--model.optimizer.lr", "1e12",
            "--step_checkpoint.every_n_train_steps", "1",
        )  # fmt: skip
    message = str(stop.value.code)
    # Caught at the first non-finite loss, or at the first checkpoint of non-finite weights.
    assert message.startswith("error: training diverged: ")
    assert " step " in message and "last good checkpoint:" in message
    kept = Path(message.rsplit("last good checkpoint: ", 1)[1])
    state = torch.load(kept, weights_only=True)["state_dict"]
    assert all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point())


@pytest.mark.slow
def test_a_failing_rank_stops_every_process(command: Callable, tmp_path: Path) -> None:
    args = ["--devices", "2", "--strategy", "ddp", "--max_epochs", "1"]
    failed = run(command(*args, *with_callback("RaiseAtStep", step=2, rank=1)), tmp_path)
    assert failed.returncode != 0
    assert "injected failure on rank 1 at step 2" in failed.stderr


@pytest.mark.parametrize(
    "strategy",
    [
        ["--strategy", "ddp"],
        ["--strategy", "ddp_spawn"],
        ["--trainer.strategy", "DDPStrategy", "--trainer.strategy.start_method", "spawn"],
    ],
    ids=["name", "spawn", "class"],
)
def test_a_strategy_given_by_name_or_class_waits_the_collective_timeout(
    strategy: list[str], data_args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = ["--accelerator", "cpu", "--devices", "2", "--collective_timeout", "12.5"]
    cli = build_cli([*layout, *strategy, *data_args])
    given: dict[str, object] = {}
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *_, **kw: given.update(kw))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # Lightning sets them; put back after
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert isinstance(cli.trainer.strategy, DDPStrategy)
    cli.trainer.strategy.setup_distributed()  # what each process does first
    assert given["timeout"] == timedelta(seconds=12.5)


def test_a_run_with_a_named_strategy_saves_it_resumable_with_its_timeout(
    train: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    timeouts = []
    init_process_group = torch.distributed.init_process_group

    def recorded(*args: object, **kwargs: object) -> None:
        timeouts.append(kwargs["timeout"])
        init_process_group(*args, **kwargs)

    monkeypatch.setattr(torch.distributed, "init_process_group", recorded)
    train("--strategy", "ddp", "--max_epochs", "1", "--collective_timeout", "12.5")
    saved = yaml.safe_load((RUN / "version_0" / "config.yaml").read_text())
    assert saved["trainer"]["strategy"] == {
        "class_path": "lightning.pytorch.strategies.ddp.DDPStrategy",
        "init_args": {"start_method": "popen", "timeout": "0:00:12.500000"},
    }
    # Resumed from that config; a timeout given then is the one that counts.
    train("--ckpt_path", "last", "--max_epochs", "2", "--collective_timeout", "30")
    assert saved_step(RUN / "version_0") == 8
    assert timeouts == [timedelta(seconds=12.5), timedelta(seconds=30)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "sigterm"),
    [("ddp", False), ("ddp", True), ("auto", False)],
    ids=["waiting", "sigterm", "waiting-auto"],  # auto: Lightning picks DDP for two devices
)
def test_processes_out_of_step_end_with_an_error_naming_rank_and_collective(
    strategy: str, sigterm: bool, command: Callable, tmp_path: Path
) -> None:
    args = ["--devices", "2", "--strategy", strategy, "--max_epochs", "1"]
    args += ["--collective_timeout", "10", *with_callback("CollectiveOnOneRank", step=2, rank=1)]
    log = tmp_path / "output.log"
    started = time.monotonic()
    with log.open("w") as output:
        process = subprocess.Popen(
            command(*args), cwd=tmp_path, env=run_env(), stdout=output, stderr=subprocess.STDOUT
        )
        if sigterm:  # what a scheduler (or a user's kill) does to a run that seems stuck
            while "enters an all_reduce alone" not in log.read_text():
                assert process.poll() is None, log.read_text()[-3000:]
                time.sleep(0.2)
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail(f"still running 120 s later:\n{log.read_text()[-3000:]}")
    text = log.read_text()
    assert process.returncode not in (0, None), text[-3000:]
    named = r"error: rank \d of 2 waited 10 s in torch\.distributed\.\w+"
    assert re.search(named, text), text[-3000:]
    assert time.monotonic() - started < 100


@pytest.mark.slow
def test_a_collective_after_the_progress_bar_at_epoch_end_does_not_hang(
    command: Callable, tmp_path: Path
) -> None:
    args = ["--devices", "2", "--strategy", "ddp", "--max_epochs", "1"]
    args += ["--trainer.enable_progress_bar", "true", "--collective_timeout", "60"]
    args += with_callback("GatherAfterTheBar", save_top_k=0)
    result = run(command(*args), tmp_path, timeout=150)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "rank 0 gathered [0.0, 1.0]" in result.stdout


def test_a_new_run_never_overwrites_an_old_one(train: Callable) -> None:
    first = train("--max_epochs", "1")
    second = train("--max_epochs", "1", "--model.optimizer.lr", "0.01")
    assert sorted(p.name for p in RUN.iterdir()) == ["version_0", "version_1"]
    for version, metrics in (("version_0", first), ("version_1", second)):
        saved = json.loads((RUN / version / "test_metrics.json").read_text())
        assert saved["test/acc"] == pytest.approx(metrics["test/acc"])


def refusal(train: Callable, *args: str) -> str:
    """The one-line message a run with these arguments exits with."""
    with pytest.raises(SystemExit) as stop:
        train(*args)
    message = str(stop.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def test_bad_data_is_refused_by_name_before_anything_is_written(
    train: Callable, bad_data: dict[str, tuple[list[str], str]]
) -> None:
    for case, (args, expected) in bad_data.items():
        assert expected in refusal(train, *args), case
    assert not Path("runs").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model.lable_smoothing", "0.1"], "lable_smoothing"),
        (["--data.batch_size", "eight"], "data.batch_size"),
        (["--data.batch_size", "0"], "data.batch_size must be a positive integer, got 0"),
        (["--data.batch_size", "-4"], "data.batch_size must be a positive integer, got -4"),
        (["--devices", "4096"], "--devices 4096 is more than the"),
        (["--devices", "x"], "--devices x: accepted: a count (1, 2, ...), auto"),
        (["--accelerator", "tpux"], "--accelerator tpux: accepted: auto, gpu, cpu, "),
        (["--max_epochs", "-5"], "max_epochs"),
        (["--max_epochs", "two"], "trainer.max_epochs two: accepted: an integer, null"),
        (["--ckpt_path", "no/such.ckpt"], "is not a file"),
    ],
    ids=[
        "misspelled",
        "wrong type",
        "zero batch",
        "negative batch",
        "devices",
        "device count",
        "accelerator",
        "epochs",
        "epochs type",
        "path",
    ],
)
def test_bad_flags_are_refused_on_one_line(train: Callable, args: list[str], expected: str) -> None:
    assert expected in refusal(train, *args)
    assert not Path("runs").exists()


def test_a_gpu_that_is_not_there_is_refused(
    train: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "torch sees no CUDA GPU" in refusal(train, "--accelerator", "gpu")


class Payload:
    """Stands for any object whose unpickling would run code."""


@pytest.fixture
def checkpoint(train: Callable) -> Path:
    train("--max_epochs", "1")
    return RUN / "version_0" / "checkpoints" / "last.ckpt"


def test_unsafe_damaged_or_foreign_checkpoints_are_refused(
    train: Callable, checkpoint: Path, tmp_path: Path
) -> None:
    content = torch.load(checkpoint, weights_only=True)
    pickled = tmp_path / "pickled.ckpt"
    torch.save({**content, "extra": Payload()}, pickled)
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(checkpoint.read_bytes()[:1000])
    foreign = tmp_path / "foreign.ckpt"
    state = {f"backbone.{key}": value for key, value in torch.nn.Linear(3, 2).state_dict().items()}
    torch.save({**content, "state_dict": state}, foreign)
    weights = tmp_path / "weights.pt"
    torch.save(content["state_dict"], weights)
    optimizer = content["optimizer_states"][0]  # as before the classifier had its own group
    first, second = optimizer["param_groups"]
    optimizer["param_groups"] = [{**first, "params": first["params"] + second["params"]}]
    one_group = tmp_path / "one_group.ckpt"
    torch.save(content, one_group)

    assert "holds a pickled Python object" in refusal(train, "--ckpt_path", str(pickled))
    assert "truncated.ckpt is truncated" in refusal(train, "--ckpt_path", str(truncated))
    message = refusal(train, "--ckpt_path", str(foreign))
    assert "was trained with other layers (backbone.bias not in the model and" in message
    assert "not a Lightning training checkpoint" in refusal(train, "--ckpt_path", str(weights))
    message = refusal(train, "--ckpt_path", str(one_group))
    assert "was trained with 1 optimizer parameter group(s) (now 2)" in message
    assert sorted(p.name for p in RUN.iterdir()) == ["version_0"]  # nothing new was started
