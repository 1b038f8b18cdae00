"""The tools for runs that misbehave: plots, gradient norms, shapes, throughput, presets, env."""

import re
from collections.abc import Callable
from pathlib import Path

import matplotlib.image
import pytest
import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from lightning.pytorch.profilers import PassThroughProfiler, SimpleProfiler
from lightning.pytorch.utilities.model_summary import ModelSummary
from logged import scalars
from torch import Tensor, nn
from torchmetrics.classification import MulticlassConfusionMatrix

from {{ cookiecutter.package_name }}.data import DataModule
from {{ cookiecutter.package_name }}.kit import env, runs
from {{ cookiecutter.package_name }}.kit.callbacks import PacedProgressBar, StepProgressBar
from {{ cookiecutter.package_name }}.kit.cli import Unprofiled, build_cli
from {{ cookiecutter.package_name }}.kit.errors import ConfigError
from {{ cookiecutter.package_name }}.kit.plots import confusion_figure
from {{ cookiecutter.package_name }}.model import ImageClassifier

RUN = Path("runs/default/version_0")
DEBUG = Path(__file__).parents[1] / "configs" / "debug"
PACED = f"{PacedProgressBar.__module__}.PacedProgressBar"


class FixedInput(nn.Module):
    """A backbone that only takes 3 x 28 x 28 images, whatever the data says."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 28 * 28, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class NaNGradient(nn.Module):
    """A backbone whose backward pass yields NaN: sqrt'(0) is infinite, times zero."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))

    def forward(self, x: Tensor) -> Tensor:
        logits = self.net(x)
        return logits + torch.sqrt(logits * 0)


class KeepsTrainer(Callback):
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.trainer = trainer


def assert_image(path: Path) -> None:
    pixels = matplotlib.image.imread(path)
    height, width = pixels.shape[:2]
    assert height >= 300 and width >= 300, f"{path.name} is {width}x{height}"
    assert pixels.std() > 0.01, f"{path.name} is blank"


def test_run_draws_curves_and_confusion_matrix_and_logs_grad_norms_and_throughput(
    train: Callable, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    # 24 steps: enough for the throughput window of 20 batches.
    kept = KeepsTrainer()
    metrics = train("--max_epochs", "6", "--model.grad_norm_every_n_steps", "5", callbacks=[kept])
    summary = capsys.readouterr().out
    assert f"Best checkpoint: {RUN}/checkpoints/epoch" in summary
    checkpoint = kept.trainer.checkpoint_callback
    score = f"(val/loss {float(checkpoint.best_model_score):.4f})"
    assert score in summary
    # Where a run hands back the best path only (ddp_spawn's first process after the fit), the
    # summary reads the score from that checkpoint.
    checkpoint.best_model_score = None
    assert runs.summary(kept.trainer, metrics, str(RUN)).splitlines()[0].endswith(score)
    assert f"test/acc {metrics['test/acc']:.4f}" in summary
    assert f"--ckpt_path {RUN}/checkpoints/last.ckpt" in summary
    epochs = [line for line in caplog.messages if line.startswith("Epoch ")]
    assert len(epochs) == 6 and epochs[-1].startswith("Epoch 5/5: train/loss_epoch ")
    assert "val/acc" in epochs[-1] and "val/f1" not in epochs[-1]
    for name in ("loss.png", "accuracy.png", "learning_rate.png", "confusion_matrix.png"):
        assert_image(RUN / "plots" / name)
    total = scalars(RUN, "grad_2.0_norm_total")
    assert [step for step, _ in total] == [0, 5, 10, 15, 20]
    assert all(value > 0 for _, value in total)
    assert scalars(RUN, "grad_2.0_norm/head.1.weight")
    assert scalars(RUN, "train/device/samples_per_sec")
    assert scalars(RUN, "train/device/batches_per_sec")


def test_the_summary_of_a_run_that_trained_no_step_offers_nothing_it_lacks(
    train: Callable, capsys: pytest.CaptureFixture
) -> None:
    train("--max_epochs", "0")  # tests the initial weights
    summary = capsys.readouterr().out
    assert "Best checkpoint: none" in summary
    assert f"Run folder:      {RUN}  (config.yaml, plots/, test_metrics.json)" in summary
    assert not (RUN / "checkpoints").exists() and "Resume:" not in summary


def test_the_confusion_matrix_names_the_classes_and_counts_each_cell() -> None:
    matrix = MulticlassConfusionMatrix(3)
    matrix.update(torch.tensor([0, 1, 1, 2, 2, 2]), torch.tensor([0, 1, 2, 2, 2, 0]))
    counts = matrix.compute()  # rows: true class, columns: predicted class
    axes = confusion_figure(matrix, counts, ["cat", "dog", "fox"]).axes[0]
    assert [label.get_text() for label in axes.get_xticklabels()] == ["cat", "dog", "fox"]
    assert [label.get_text() for label in axes.get_yticklabels()] == ["cat", "dog", "fox"]
    cells = {text.get_position(): text.get_text() for text in axes.texts}  # (column, row)
    assert cells[(2, 0)] == "1" and cells[(0, 2)] == "0"  # a cat taken for a fox, not back
    assert cells[(2, 2)] == "2" and len(cells) == 9


class CurvesSeen(Callback):
    """Notes at the start of every epoch after the first whether the curves are drawn yet."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def on_train_epoch_start(self, trainer: Trainer, *_: object) -> None:
        if trainer.current_epoch > 0:
            self.seen.append((RUN / "plots" / "loss.png").is_file())


@pytest.mark.parametrize(
    ("every_n_seconds", "drawn_during_fit"), [("0", [True, True]), ("3600", [False, False])]
)
def test_curves_are_redrawn_after_a_validation_once_their_interval_has_passed(
    train: Callable, every_n_seconds: str, drawn_during_fit: list[bool]
) -> None:
    seen = CurvesSeen()
    train("--max_epochs", "3", "--curves.every_n_seconds", every_n_seconds, callbacks=[seen])
    assert seen.seen == drawn_during_fit
    assert_image(RUN / "plots" / "loss.png")  # drawn at the end of fit, whatever the interval


def test_a_negative_curves_interval_is_refused_in_one_line(train: Callable) -> None:
    with pytest.raises(SystemExit, match=r"^error: curves.every_n_seconds is -1.0; accepted: 0"):
        train("--curves.every_n_seconds", "-1")
    assert not Path("runs").exists()


@pytest.mark.parametrize(
    ("args", "bar"),
    [
        ([], StepProgressBar),
        (["--trainer.enable_progress_bar", "false"], type(None)),
        ([f"--trainer.callbacks+={PACED}"], PacedProgressBar),
    ],
    ids=["default", "off", "paced"],
)
def test_the_progress_bar_is_tqdm_unless_switched_off_or_another_is_chosen(
    args: list[str],
    bar: type,
    data_args: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    cli = build_cli([*data_args, *args])
    assert type(cli.trainer.progress_bar_callback) is bar


EPOCHS = ("Epoch 0", "Epoch 1")


@pytest.mark.parametrize("min_interval", [0, 3600])
def test_the_bar_redraws_at_most_once_per_interval_and_at_each_epoch_end(
    min_interval: int, train: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    redraws: list[tuple[str, int]] = []
    refresh = Tqdm.refresh

    def counted(bar: Tqdm, *args: object, **kwargs: object) -> None:
        # tqdm sets desc ("Epoch 0: ") and n after its first refresh.
        redraws.append((getattr(bar, "desc", "").rstrip(": "), getattr(bar, "n", 0)))
        refresh(bar, *args, **kwargs)

    monkeypatch.setattr(Tqdm, "refresh", counted)
    train(
        "--trainer.limit_train_batches", "10",
        "--trainer.enable_progress_bar", "true",
        f"--trainer.callbacks+={PACED}",
        "--trainer.callbacks.min_interval", str(min_interval),
    )  # fmt: skip
    drawn = {epoch: sorted({n for desc, n in redraws if desc == epoch}) for epoch in EPOCHS}
    steps = drawn["Epoch 0"][-1]  # the training batches of an epoch (up to 10)
    assert steps >= 3
    for epoch in EPOCHS:  # its last drawing is its full count, not the next epoch's empty line
        assert [n for desc, n in redraws if desc == epoch][-1] == steps, (epoch, redraws)
    if min_interval == 0:  # like Lightning's own bar: every step
        assert all(steps_drawn == list(range(steps + 1)) for steps_drawn in drawn.values())
        # Once each (Lightning's own bar draws a step twice: its count, then its metrics);
        # an epoch's first and last count are drawn again as it starts and ends.
        for epoch in EPOCHS:
            inside = [n for desc, n in redraws if desc == epoch and 0 < n < steps]
            assert inside == list(range(1, steps)), (epoch, inside)
    else:  # only where each epoch starts and ends
        assert all(steps_drawn == [0, steps] for steps_drawn in drawn.values())


def test_a_negative_bar_interval_is_refused_in_one_line(train: Callable) -> None:
    refused = (
        r"^error: trainer\.callbacks\.min_interval \(\S+\.PacedProgressBar\): "
        r"Not of type NonNegativeFloat: -1 does not conform to restriction v>=0 \(python"
    )
    with pytest.raises(SystemExit, match=refused):
        train(
            "--trainer.enable_progress_bar", "true",
            f"--trainer.callbacks+={PACED}",
            "--trainer.callbacks.min_interval", "-1",
        )  # fmt: skip
    assert not Path("runs").exists()
    with pytest.raises(ConfigError, match=r"^min_interval is -1; accepted: 0 or more seconds$"):
        PacedProgressBar(min_interval=-1)


def test_model_summary_shows_input_and_output_shapes(make_datamodule: Callable) -> None:
    datamodule: DataModule = make_datamodule()
    model = ImageClassifier(datamodule.num_classes, datamodule.input_shape)
    summary = ModelSummary(model, max_depth=1)
    assert summary.in_sizes[0] == [2, *datamodule.input_shape]
    assert summary.out_sizes[0] == [2, datamodule.num_classes]
    assert str(list(datamodule.input_shape)[1:])[1:-1] in str(summary)


def test_shape_mismatch_fails_before_training_in_one_line(
    train: Callable, make_datamodule: Callable
) -> None:
    shape = make_datamodule().input_shape
    with pytest.raises(SystemExit) as exit_info:
        train("--model.backbone", "test_debug.FixedInput")
    message = str(exit_info.value)
    assert message.startswith("error: backbone FixedInput") and "\n" not in message
    assert str(tuple(shape)) in message
    assert not Path("runs").exists()  # refused before a run folder exists


def test_data_that_disagrees_with_its_declared_shape_is_refused(
    make_datamodule: Callable,
) -> None:
    datamodule: DataModule = make_datamodule()
    channels, height, width = datamodule.input_shape
    declared = (channels + 1, height, width)
    model = ImageClassifier(datamodule.num_classes, declared)
    trainer = Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False)
    with pytest.raises(ConfigError, match=re.escape(f"data.input_shape says {declared}")):
        trainer.fit(model, datamodule=datamodule)
    assert trainer.global_step == 0


def test_debug_fast_dev_run(train: Callable) -> None:
    metrics = train("--config", str(DEBUG / "fast_dev_run.yaml"))
    assert 0.0 <= metrics["test/acc"] <= 1.0
    assert not Path("runs").exists()


def test_debug_overfit_drives_the_training_loss_near_zero(train: Callable) -> None:
    train("--config", str(DEBUG / "overfit.yaml"))
    losses = [value for _, value in scalars(RUN, "train/loss_epoch")]
    assert len(losses) == 100
    assert losses[-1] < 0.1, f"training loss ended at {losses[-1]:.3f}"


def test_debug_limit_uses_a_quarter_of_each_split(
    train: Callable, make_datamodule: Callable
) -> None:
    datamodule: DataModule = make_datamodule()
    datamodule.setup("fit")
    # Small enough a batch that a quarter of the validation split is a whole batch.
    batch_size = min(16, len(datamodule.val_set) // 4)
    datamodule = make_datamodule(batch_size=batch_size)
    datamodule.setup("fit")
    train(
        "--config",
        str(DEBUG / "limit.yaml"),
        "--data.batch_size",
        str(batch_size),
        "--max_epochs",
        "1",
    )
    checkpoint = torch.load(RUN / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == int(len(datamodule.train_dataloader()) * 0.25)


def test_debug_profile_writes_its_report_into_the_run_folder(train: Callable) -> None:
    train("--config", str(DEBUG / "profile.yaml"), "--max_epochs", "1")
    report = (RUN / "fit-profile.txt").read_text()
    assert "FIT Profiler Report" in report and "run_training_batch" in report


def test_without_a_profiler_the_hooks_are_timed_by_nothing(
    data_args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    profiler = build_cli(data_args).trainer.profiler
    assert type(profiler) is Unprofiled  # not Lightning's default, which costs more per hook
    with profiler.profile("outer"), profiler.profile("inner"):  # nested, as Lightning does
        pass
    assert profiler.summary() == ""
    chosen = build_cli([*data_args, "--trainer.profiler", "simple"]).trainer.profiler
    assert type(chosen) is SimpleProfiler
    named = ["--trainer.profiler", "lightning.pytorch.profilers.PassThroughProfiler"]
    assert type(build_cli([*data_args, *named]).trainer.profiler) is PassThroughProfiler


@pytest.mark.filterwarnings("ignore:Error detected in MulBackward0")  # the traceback it prints
def test_debug_anomaly_names_the_operation_that_made_a_nan(train: Callable) -> None:
    with pytest.raises(RuntimeError, match="returned nan values"):
        train("--config", str(DEBUG / "anomaly.yaml"), "--model.backbone", "test_debug.NaNGradient")


def test_env_report_warns_when_a_cuda_build_finds_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = env.report()
    assert lines[0].startswith("Python") and any(line.startswith("torch ") for line in lines)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert env.report()[-1].startswith("warning: this torch is built for CUDA 12.4")
    monkeypatch.setattr(torch.version, "cuda", None)
    assert not any(line.startswith("warning") for line in env.report())
