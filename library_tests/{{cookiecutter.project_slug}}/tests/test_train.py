"""train.py end to end: the run folder, checkpoints, resume, config round trip and errors."""

import json
import re
import sys
{%- if cookiecutter.logger == "tensorboard" %}
import threading
{%- endif %}
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ThroughputMonitor, TQDMProgressBar
from logged import hyperparameters, scalars
from torchmetrics.classification import MulticlassCalibrationError

from {{ cookiecutter.package_name }} import model as model_module
from {{ cookiecutter.package_name }}.data import DataModule
from {{ cookiecutter.package_name }}.kit.callbacks import EpochLine
from {{ cookiecutter.package_name }}.kit.checkpoint import load_checkpoint, resolve_checkpoint
from {{ cookiecutter.package_name }}.kit.cli import CALLBACKS, TrainCLI, build_cli
from {{ cookiecutter.package_name }}.kit.errors import ConfigError
from {{ cookiecutter.package_name }}.kit.evaluate import main as evaluate
from {{ cookiecutter.package_name }}.kit.metrics import EpochMeans
from {{ cookiecutter.package_name }}.kit.project import use
from {{ cookiecutter.package_name }}.kit.runs import loggable, metric_directions
from {{ cookiecutter.package_name }}.model import ImageClassifier

PROJECT = Path(__file__).resolve().parents[1]
CONFIGS = PROJECT / "configs"
DATA_CLASS = "{{ cookiecutter.package_name }}.data.DataModule"
RUN = Path("runs/default/version_0")
SECOND = Path("runs/default/version_1")


def parse(*args: str) -> TrainCLI:
    """Build everything train.py would, without training."""
    return build_cli(list(args))


def test_fast_dev_run_trains_and_tests_one_batch(train: Callable) -> None:
    metrics = train("--trainer.fast_dev_run", "true")
    assert 0.0 <= metrics["test/acc"] <= 1.0
    # fast_dev_run writes no run folder (an MLflow logger still opens its store, runs/mlflow.db).
    assert not list(Path().glob("runs/*/version_*"))


def test_single_step(train: Callable) -> None:
    train("--trainer.max_steps", "1")
    checkpoint = torch.load(RUN / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 1


def test_run_folder_holds_config_checkpoints_logs_and_test_metrics(train: Callable) -> None:
    metrics = train()
    assert (RUN / "config.yaml").is_file()
    assert (RUN / "checkpoints" / "last.ckpt").is_file()
    best = [p for p in (RUN / "checkpoints").glob("epoch*.ckpt")]
    assert len(best) == 1 and "val_loss" in best[0].name
    saved = json.loads((RUN / "test_metrics.json").read_text())
    assert saved["test/acc"] == pytest.approx(metrics["test/acc"])
    directions = json.loads((RUN / "metric_directions.json").read_text())
    assert directions == {"val/loss": "min", "val/acc": "max", "val/f1": "max"}
    assert Path(saved["checkpoint"]) == best[0]
    tags = ("train/loss_step", "val/loss", "val/acc", "val/f1", "test/acc")
    for tag in (*tags, "lr-AdamW/classifier", "lr-AdamW/features"):
        assert scalars(RUN, tag), f"{tag} was not logged"


{% if cookiecutter.logger == "tensorboard" -%}
def writer_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if type(t).__name__ == "_AsyncWriterThread"}


{% endif -%}
def test_hyperparameters_and_test_metrics_reach_the_logger(train: Callable) -> None:
{%- if cookiecutter.logger == "tensorboard" %}
    writers_before = writer_threads()
{%- endif %}
    {% if cookiecutter.logger == "tensorboard" %}metrics = {% endif %}train("--model.optimizer.init_args.lr", "0.003", "--seed_everything", "7")
    logged = hyperparameters(RUN)
    assert logged["model.optimizer.init_args.lr"] == pytest.approx(0.003)
    assert logged["seed_everything"] == 7
    assert logged["model.backbone.class_path"].endswith("ConvNet")
    assert "trainer.logger.init_args.save_dir" not in logged  # where, not how, it trained
{%- if cookiecutter.logger == "tensorboard" %}
    # The HParams tab lists the test metrics beside them (and no placeholder hp_metric),
    # which the test logged once each: not again for the tab, where a chart would show it.
    assert logged["metrics"] == sorted(metrics)
    assert {name: len(scalars(RUN, name)) for name in metrics} == dict.fromkeys(metrics, 1)
    # Written and closed when the run returns: no writer thread is left to write them later
    # (into whatever folder is current then).
    assert writer_threads() <= writers_before
{%- endif %}


def test_checkpoints_load_without_pickle(train: Callable) -> None:
    train()
    for path in (RUN / "checkpoints").glob("*.ckpt"):
        checkpoint = torch.load(path, weights_only=True)
        assert checkpoint["hyper_parameters"]["backbone"]["class_path"].endswith("ConvNet")
    model = ImageClassifier.load_from_checkpoint(
        RUN / "checkpoints" / "last.ckpt", weights_only=True
    )
    assert isinstance(model, ImageClassifier)


def test_resume_from_last_continues_at_the_saved_epoch_and_step(train: Callable) -> None:
    train("--max_epochs", "2")
    first = torch.load(RUN / "checkpoints" / "last.ckpt", weights_only=True)
    assert (first["epoch"], first["global_step"]) == (1, 8)
    train("--max_epochs", "3", "--ckpt_path", "last")
    resumed = torch.load(RUN / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == 12
    assert not Path("runs/default/version_1").exists()  # logged into the resumed run's folder
    steps = [step for step, _ in scalars(RUN, "train/loss_step")]
    assert len(steps) == len(set(steps)) == 12  # steps 0-7 once, then 8-11: no restart from zero
    # The schedule, planned for 8 steps, ends at zero at the 12 it now has: it does not climb
    # back up past its first end.
    for group in resumed["optimizer_states"][0]["param_groups"]:
        assert group["lr"] < 0.01 * group["initial_lr"], group


def test_a_resumed_run_whose_config_this_project_cannot_read_is_named(train: Callable) -> None:
    train("--max_epochs", "1")
    config = RUN / "config.yaml"
    saved = yaml.safe_load(config.read_text())
    saved["data"]["init_args"]["nonsense"] = 1  # as another project's run would have it
    config.write_text(yaml.safe_dump(saved))
    with pytest.raises(SystemExit) as exit_info:
        train("--max_epochs", "2", "--ckpt_path", "last")
    message = str(exit_info.value.code)
    assert message.startswith(f"error: {config}, the resumed run's config: data.nonsense is not ")


def test_the_step_loss_is_logged_on_the_steps_that_write_it_only(
    train: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each self.log call costs Lightning about as much Python as a small network's step.
    logged = []
    log = ImageClassifier.log

    def counted(self: ImageClassifier, name: str, *args: object, **kwargs: object) -> None:
        if name == "train/loss_step":
            logged.append(self.global_step)
        log(self, name, *args, **kwargs)

    monkeypatch.setattr(ImageClassifier, "log", counted)
    train("--max_epochs", "2", "--trainer.log_every_n_steps", "3")  # 8 steps
    assert logged == [2, 5]
    assert [step for step, _ in scalars(RUN, "train/loss_step")] == logged


def test_the_metric_objects_are_logged_once_an_epoch_and_computed_over_all_its_steps(
    train: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lightning keeps a logged metric object and computes it at the epoch's end: logging it
    # again at every step costs as much Python as the step.
    logged: list[tuple[str, int]] = []
    right: dict[tuple[str, int], list[bool]] = {}
    log_metrics = model_module.log_metrics
    log_dict = ImageClassifier.log_dict

    def when(module: ImageClassifier, metrics) -> tuple[str, int]:
        """The metrics' stage ("train/acc" -> "train") and epoch (-1: the sanity check)."""
        epoch = -1 if module.trainer.sanity_checking else module.current_epoch
        return next(iter(metrics.keys())).split("/")[0], epoch

    def recorded(module: ImageClassifier, metrics, logits: torch.Tensor, y: torch.Tensor) -> None:
        right.setdefault(when(module, metrics), []).extend((logits.argmax(-1) == y).tolist())
        log_metrics(module, metrics, logits, y)

    def counted(self: ImageClassifier, values, *args: object, **kwargs: object) -> None:
        logged.append(when(self, values))
        log_dict(self, values, *args, **kwargs)

    monkeypatch.setattr(model_module, "log_metrics", recorded)
    monkeypatch.setattr(ImageClassifier, "log_dict", counted)
    train("--max_epochs", "2")  # 4 training steps an epoch
    assert len(right["train", 0]) > 4 * 2  # several steps, several images each
    # Once a training epoch, once a validation run (the sanity check's too), once the test.
    assert logged == [("val", -1), ("train", 0), ("val", 0), ("train", 1), ("val", 1), ("test", 2)]
    for stage, tag in (("train", "train/acc"), ("val", "val/acc")):
        values = [value for _, value in scalars(RUN, tag)]
        expected = [sum(right[stage, e]) / len(right[stage, e]) for e in (0, 1)]
        assert values == pytest.approx(expected), tag


def test_the_losses_epoch_means_are_logged_once_an_epoch(
    train: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The training loss and its terms, the validation and test losses: metric objects
    # (kit.metrics.EpochMeans) logged once an epoch or run, not a self.log call at every step.
    steps: dict[tuple[str, int], list[tuple[float, int]]] = {}
    logged: list[tuple[str, int]] = []
    update = EpochMeans.log
    log = LightningModule.log

    def when(module: LightningModule) -> int:
        return -1 if module.trainer.sanity_checking else module.current_epoch

    def recorded(self: EpochMeans, module: LightningModule, name: str, value, size, **kw):
        steps.setdefault((name, when(module)), []).append((value.item(), size))
        update(self, module, name, value, size, **kw)

    def counted(self: LightningModule, name: str, *args: object, **kwargs: object) -> None:
        logged.append((name, when(self)))
        log(self, name, *args, **kwargs)

    monkeypatch.setattr(EpochMeans, "log", recorded)
    monkeypatch.setattr(LightningModule, "log", counted)
    train("--max_epochs", "2", "--model.backbone.head_penalty", "0.5")
    names = sorted({name for name, _ in steps})
    # The loss, the penalty's one term and their sum; the validation and test losses.
    assert len(names) == 5 and {"train/loss_epoch", "val/loss", "test/loss"} <= set(names)
    assert sorted(key for key in logged if key[0] in names) == sorted(steps)
    assert sorted(steps) == sorted(
        [(name, e) for name in names if name.startswith("train/") for e in (0, 1)]
        + [("val/loss", e) for e in (-1, 0, 1)]
        + [("test/loss", 2)]
    )
    for name in names:
        epochs = sorted(e for n, e in steps if n == name and e >= 0)
        if name.startswith("train/"):
            assert all(len(steps[name, e]) > 2 for e in epochs)  # several steps averaged
        expected = [
            sum(v * n for v, n in steps[name, e]) / sum(n for _, n in steps[name, e])
            for e in epochs
        ]
        if name != "test/loss":  # written by the test, not read back here
            values = [value for _, value in scalars(RUN, name)]
            assert values == pytest.approx(expected, rel=1e-6), name


def test_a_resumed_runs_config_says_what_it_went_on_with(train: Callable) -> None:
    train("--max_epochs", "1")
    train("--ckpt_path", "last", "--max_epochs", "2")
    config = yaml.safe_load((RUN / "config.yaml").read_text())
    assert config["trainer"]["max_epochs"] == 2  # results.py shows it, a resume starts from it
    assert config["ckpt_path"] is None  # --config config.yaml repeats the run from its start
    evaluate(["--ckpt_path", "last", "--data.batch_size", "8"])  # testing it changes nothing
    assert yaml.safe_load((RUN / "config.yaml").read_text()) == config


def test_resume_last_goes_on_as_the_newest_run_was_configured(train: Callable) -> None:
    train("--max_epochs", "1")
    train("--max_epochs", "1", "--config", str(CONFIGS / "model" / "sgd_step.yaml"))
    # The newest run used SGD; the command without that config resumes it as SGD.
    train("--max_epochs", "2", "--ckpt_path", "last")
    resumed = torch.load(SECOND / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["epoch"] == 1
    assert resumed["hyper_parameters"]["optimizer"]["class_path"] == "torch.optim.SGD"
    assert "momentum" in resumed["optimizer_states"][0]["param_groups"][0]
    assert not Path("runs/default/version_2").exists()


@pytest.mark.parametrize(
    "content",
    [b"hello\n", b'{"state_dict": {}}', b"\x89PNG\r\n\x1a\n" + bytes(64), bytes(range(256))],
    ids=["text", "json", "png", "bytes"],
)
def test_a_file_that_is_no_torch_file_is_named_in_one_line(tmp_path: Path, content: bytes) -> None:
    # Resuming, evaluating, predicting and serving read a checkpoint through this.
    path = tmp_path / "model.ckpt"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as error:
        load_checkpoint(path)
    assert str(error.value) == (
        f"{path} is not a torch file (torch.save writes a zip archive); give a checkpoint or "
        "weights file"
    )
    # A pickle stream that is no torch file: one line too.
    path.write_bytes(b"\x80\x02" + content)
    with pytest.raises(ConfigError, match=rf"^{path} ") as error:
        load_checkpoint(path)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            ["--model.optimizer", "torch.optim.SGD"],
            "model.optimizer torch.optim.AdamW (now torch.optim.SGD)",
        ),
        (
            ["--model.scheduler", "torch.optim.lr_scheduler.StepLR", "--model.scheduler.step_size",
             "1"],
            "model.scheduler None (now torch.optim.lr_scheduler.StepLR)",
        ),
        (["--model.backbone.width", "8"], "other layers (backbone."),
    ],
    ids=["optimizer", "scheduler", "layer shapes"],
)  # fmt: skip
def test_resume_refuses_a_change_the_checkpoint_cannot_take(
    train: Callable, change: list[str], named: str
) -> None:
    train("--max_epochs", "1")
    last = RUN / "checkpoints" / "last.ckpt"
    written = last.stat().st_mtime_ns
    with pytest.raises(SystemExit) as exit_info:
        train("--max_epochs", "2", "--ckpt_path", str(last), *change)
    message = str(exit_info.value)
    assert named in message, message
    assert f"resume as it was configured (python train.py --ckpt_path {last}" in message
    assert len(message.splitlines()) == 1
    assert last.stat().st_mtime_ns == written


def test_a_run_from_before_the_library_moved_is_refused_naming_the_new_class_path(
    train: Callable,
) -> None:
    """A run made when the callbacks lived beside model.py: its config.yaml names them there."""
    train("--max_epochs", "1")
    config = RUN / "config.yaml"
    new = "{{ cookiecutter.package_name }}.kit.callbacks.EpochLine"
    old = new.replace(".kit.", ".")
    config.write_text(config.read_text().replace(new, old))
    with pytest.raises(SystemExit) as exit_info:
        train("--max_epochs", "2", "--ckpt_path", "last")
    message = str(exit_info.value)
    assert f"epoch_line {old} moved: it is {new} now" in message, message
    assert len(message.splitlines()) == 1


def test_the_model_class_alone_is_no_project() -> None:
    with pytest.raises(ConfigError, match=r"give a Project\(model="):
        use(ImageClassifier)  # callable, as the function in project.py is: refused here


def test_resume_without_a_previous_run_says_so(
    train: Callable, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        train("--ckpt_path", "last")
    message = (
        "--ckpt_path {}: no trained run under runs/default (none has checkpoints/last.ckpt); "
        "train first or give a checkpoint file"
    )
    assert str(exit_info.value) == "error: " + message.format("last")
    # evaluate.py's default, found through the newest run's last.ckpt too
    with pytest.raises(ConfigError) as error:
        resolve_checkpoint("best")
    assert str(error.value) == message.format("best")


def test_saved_config_reproduces_the_run(train: Callable) -> None:
    train("--model.loss.label_smoothing", "0.05", "--model.optimizer.lr", "0.002")
    config = yaml.safe_load((RUN / "config.yaml").read_text())
    assert config["ckpt_path"] is None
    assert config["model"]["loss"]["init_args"]["label_smoothing"] == 0.05
    again = parse("--config", str(RUN / "config.yaml"))
    assert again.model.loss.label_smoothing == 0.05
    assert again.model.hparams["optimizer"]["init_args"]["lr"] == 0.002
    assert again.trainer.max_epochs == 2


def test_the_loss_is_one_key(train: Callable) -> None:
    """The README's example: a hinge loss instead of cross-entropy, for every step."""
    default = train()
    hinge = train("--model.loss", "torch.nn.MultiMarginLoss")
    assert hinge["test/loss"] != pytest.approx(default["test/loss"], rel=0.05)
    run = RUN.parent / "version_1"
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"]["loss"]["class_path"] == "torch.nn.MultiMarginLoss"
    model = parse("--config", str(run / "config.yaml")).model
    assert isinstance(model.loss, torch.nn.MultiMarginLoss)


def test_an_average_of_the_weights_is_what_validation_and_checkpoints_hold(
    train: Callable,
) -> None:
    seen = ValidatedWeights()
    train("--config", str(CONFIGS / "model" / "ema.yaml"), callbacks=[seen])
    (best,) = (RUN / "checkpoints").glob("epoch*.ckpt")
    saved = torch.load(best, weights_only=True)
    average, current = saved["state_dict"], saved["current_model_state"]
    name = "backbone.head.1.weight"
    assert not torch.equal(average[name], current[name])
    assert any(torch.equal(weights[name], average[name]) for weights in seen.validated)
    assert not any(torch.equal(weights[name], current[name]) for weights in seen.validated)
    # The test after fit scores the tested checkpoint's average too, as evaluate.py does.
    (tested,) = seen.tested
    assert all(torch.equal(tested[key], average[key]) for key in average)


class ValidatedWeights(Callback):
    """The weights each validation, and the test, ran with."""

    def __init__(self) -> None:
        self.validated: list[dict[str, torch.Tensor]] = []
        self.tested: list[dict[str, torch.Tensor]] = []

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: object, batch_idx: int
    ) -> None:
        if batch_idx == 0 and not trainer.sanity_checking:
            self.validated.append({k: v.clone() for k, v in pl_module.state_dict().items()})

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: object, batch_idx: int
    ) -> None:
        if batch_idx == 0:
            self.tested.append({k: v.clone() for k, v in pl_module.state_dict().items()})


def test_the_headline_metric_is_one_key(
    train: Callable, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    train("--monitor", "val/f1")
    epochs = [line for line in caplog.messages if line.startswith("Epoch ")]
    assert epochs and all(re.search(r" val/f1 \d\.\d{4}", line) for line in epochs)
    (best,) = (RUN / "checkpoints").glob("epoch*.ckpt")
    assert re.fullmatch(r"epoch\d{3}-val_f1=\d\.\d{4}\.ckpt", best.name), best.name
    callback = torch.load(best, weights_only=True)["callbacks"]
    states = [state for key, state in callback.items() if key.startswith("ModelCheckpoint")]
    assert {state["monitor"] for state in states} >= {"val/f1"}
    assert "(val/f1 " in capsys.readouterr().out  # the summary's best checkpoint line


def test_which_way_the_monitored_metric_is_better_comes_from_the_model(
    data_args: list[str],
) -> None:
    for monitor, mode in (("val/f1", "max"), ("val/loss", "min")):
        trainer = parse(*data_args, "--monitor", monitor).trainer
        assert trainer.checkpoint_callback.monitor == monitor
        assert trainer.checkpoint_callback.mode == mode
        assert trainer.early_stopping_callback.mode == mode
    model = ImageClassifier(3, (1, 8, 8))
    model.val_metrics.add_metrics({"ece": MulticlassCalibrationError(3)})  # lower is better
    assert metric_directions(model) == {
        "val/loss": "min", "val/acc": "max", "val/f1": "max", "val/ece": "min"
    }  # fmt: skip


def test_a_monitor_the_model_does_not_log_is_refused_before_any_data_loads(
    train: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = []
    monkeypatch.setattr(DataModule, "setup", lambda self, stage: loaded.append(stage))
    with pytest.raises(SystemExit) as exit_info:
        train("--monitor", "val/acc_typo")
    assert str(exit_info.value.code) == (
        "error: --monitor val/acc_typo is not a validation metric the model logs; accepted: "
        "val/loss, val/acc, val/f1"
    )
    assert not loaded
    assert not Path("runs").exists()


def test_same_seed_gives_identical_metrics_when_deterministic(train: Callable) -> None:
    first = train("--trainer.deterministic", "true", "--seed_everything", "7")
    second = train("--trainer.deterministic", "true", "--seed_everything", "7")
    assert first == second


def test_short_flags_set_the_trainer(data_args: list[str]) -> None:
    cli = parse(
        "--max_epochs",
        "3",
        "--accelerator",
        "cpu",
        "--devices",
        "1",
        "--precision",
        "bf16-mixed",
        *data_args,
    )
    assert cli.trainer.max_epochs == 3
    assert cli.trainer.precision == "bf16-mixed"
    defaults = yaml.safe_load((CONFIGS / "default.yaml").read_text())
    assert parse(*data_args).trainer.max_epochs == defaults["trainer"]["max_epochs"]


def test_backbone_optimizer_and_scheduler_by_config(data_args: list[str], tmp_path: Path) -> None:
    config = tmp_path / "custom.yaml"
    config.write_text(
        "model:\n"
        "  backbone:\n"
        "    class_path: {{ cookiecutter.package_name }}.backbones.TorchvisionBackbone\n"
        "    init_args: {name: resnet18}\n"
        "  optimizer:\n"
        "    class_path: torch.optim.SGD\n"
        "    init_args: {lr: 0.05, momentum: 0.9}\n"
        "  scheduler:\n"
        "    class_path: torch.optim.lr_scheduler.ReduceLROnPlateau\n"
        "    init_args: {patience: 2}\n"
    )
    cli = parse("--config", str(config), *data_args)
    assert type(cli.model.backbone).__name__ == "TorchvisionBackbone"
    optimizers = cli.model.configure_optimizers()
    assert isinstance(optimizers["optimizer"], torch.optim.SGD)
    assert optimizers["lr_scheduler"]["monitor"] == "val/loss"


def test_misspelled_key_fails_before_training(train: Callable, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        train("--model.lable_smoothing", "0.1")
    assert "lable_smoothing" in str(exit_info.value.code)  # printed on exit, status 1
    config = tmp_path / "typo.yaml"
    config.write_text("trainer:\n  max_epoch: 3\n")
    with pytest.raises(SystemExit) as exit_info:
        train("--config", str(config))
    assert "max_epoch" in str(exit_info.value.code)
    with pytest.raises(SystemExit) as exit_info:
        train("--trainer.max_epoch", "3")  # not taken for --trainer.max_epochs
    assert "max_epoch" in str(exit_info.value.code)
    assert not Path("runs").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--model.loss.gama", "2"],
            "model.loss.gama is not an argument of torch.nn.CrossEntropyLoss; accepted: "
            "weight, size_average, ignore_index, reduce, reduction, label_smoothing",
        ),
        (
            ["--model.optimizer.lrr", "3"],
            "model.optimizer.lrr is not an argument of torch.optim.AdamW; accepted: lr, ",
        ),
        (
            ["--data.batch_sise", "3"],
            f"data.batch_sise is not an argument of {DATA_CLASS}; accepted: ",
        ),
        (
            ["--early_stopping.patiense", "5"],
            "early_stopping.patiense is not an argument of "
            "lightning.pytorch.callbacks.EarlyStopping; accepted: min_delta, patience, ",
        ),
        (
            ["--model.loss", "torch.nn.FocalLoss"],
            "model.loss torch.nn.FocalLoss cannot be imported: module 'torch.nn' has no "
            "attribute 'FocalLoss'",
        ),
        (
            ["--model.optimizer.lr", "-1"],
            "model.optimizer (torch.optim.AdamW): Invalid learning rate: -1.0",
        ),
        (
            ["--model.backbone.width", "-1"],
            "model.backbone.width ({{ cookiecutter.package_name }}.backbones.ConvNet): Not of "
            "type PositiveInt: -1 does not conform to restriction v>0",
        ),
        (
            ["--strategy", "bogus"],
            "--strategy bogus is not a strategy Lightning knows; accepted: auto, ddp, ",
        ),
        (
            # Accepted by the loss class, refused only when it computes: by the dry run.
            ["--model.loss.init_args.label_smoothing", "2"],
            "model.loss CrossEntropyLoss cannot compute a loss of the backbone's logits and "
            "class labels: label_smoothing must be between 0.0 and 1.0",
        ),
    ],
    ids=[
        "loss argument",
        "optimizer argument",
        "data argument",
        "callback argument",
        "class",
        "optimizer value",
        "backbone value",
        "strategy",
        "loss value",
    ],
)
def test_a_wrong_key_of_a_class_names_what_is_accepted(
    train: Callable, args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        train(*args)
    assert str(exit_info.value.code).startswith(f"error: {message}")
    assert "\n" not in str(exit_info.value.code)
    assert not Path("runs").exists()


def test_an_argument_of_a_class_in_a_config_file_without_its_class_path_is_named(
    train: Callable, tmp_path: Path
) -> None:
    config = tmp_path / "typo.yaml"
    config.write_text("model: {optimizer: {init_args: {lrr: 0.1}}}\n")
    with pytest.raises(SystemExit) as exit_info:
        train("--config", str(config))
    assert str(exit_info.value.code).startswith(
        "error: model.optimizer.lrr is not an argument of torch.optim.AdamW; accepted: lr, "
    )
    assert not Path("runs").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("trainer:\n  max_epochs: [\n", r"is not valid YAML at line 3, column 1: "),
        (
            "<<<<<<< ours\ntrainer: {max_epochs: 2}\n=======\ntrainer: {max_epochs: 3}\n"
            ">>>>>>> theirs\n",
            r"holds merge conflict markers \(<<<<<<< at line 1\): keep one side",
        ),
    ],
    ids=["broken", "merge conflict"],
)
def test_a_config_file_yaml_cannot_read_is_named(
    train: Callable, tmp_path: Path, text: str, message: str
) -> None:
    """Named with the line, not as jsonargparse's "<unicode string>" (an update from the
    template that left conflict markers in configs/default.yaml, say)."""
    config = tmp_path / "mine.yaml"
    config.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        train("--config", str(config))
    assert re.match(f"error: {re.escape(str(config))} {message}", str(exit_info.value.code))
    assert "\n" not in str(exit_info.value.code)
    assert not Path("runs").exists()


def test_unknown_precision_lists_the_accepted_values(train: Callable) -> None:
    with pytest.raises(SystemExit) as exit_info:
        train("--precision", "bf17")
    message = str(exit_info.value.code)  # what the interpreter prints on exit
    assert message.startswith("error: trainer.precision bf17: accepted: 64, 32, 16, ")
    assert "bf16-mixed" in message and "16-mixed" in message and "Literal" not in message
    assert "\n" not in message


def test_an_unknown_flag_points_to_the_help_of_the_script_that_was_run(
    train: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    # evaluate.py, export.py and the others build the same parser as train.py.
    monkeypatch.setattr(sys, "argv", [str(Path("somewhere", "evaluate.py"))])
    with pytest.raises(SystemExit) as exit_info:
        train("--bogus", "1")
    assert str(exit_info.value.code) == (
        "error: unrecognized arguments: --bogus 1 (python evaluate.py --help lists the options)"
    )


def test_evaluate_help_needs_no_trained_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)  # no runs/ here
    monkeypatch.setattr(sys, "argv", ["evaluate.py"])
    with pytest.raises(SystemExit) as exit_info:
        evaluate(["--help"])
    assert exit_info.value.code in (0, None)
    assert "--ckpt_path" in capsys.readouterr().out


def test_hyperparameters_reach_the_loggers_as_built_in_types() -> None:
    # W&B stored a subclass of int (a network's width, a PositiveInt) as text, not a number.
    from jsonargparse.typing import PositiveInt

    values = [PositiveInt(32), 1e-3, "AdamW", True, None, (0.9, 0.999), Path("runs")]
    logged = [loggable(value) for value in values]
    assert logged == [32, 1e-3, "AdamW", True, None, "[0.9, 0.999]", "runs"]
    assert [type(value) for value in logged] == [int, float, str, bool, type(None), str, str]


def test_print_config_shows_the_complete_config(
    train: Callable, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        train("--print_config")
    assert exit_info.value.code in (0, None)
    config = yaml.safe_load(capsys.readouterr().out)
    assert {"trainer", "model", "data", "checkpoint", "early_stopping", "seed_everything"} <= set(
        config
    )
    assert config["model"]["backbone"]["class_path"].endswith("ConvNet")


# Training configs: the defaults, model and hardware choices (debug/ has tests of its own).
TRAINING_CONFIGS = sorted(
    path for group in ("", "model/", "hardware/") for path in CONFIGS.glob(f"{group}*.yaml")
)


@pytest.mark.parametrize("config", TRAINING_CONFIGS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_config_file_builds_a_model_that_runs(config: Path, data_args: list[str]) -> None:
    # Parse the file as given (fsdp.yaml asks for GPUs), then build it on this CPU.
    cli = parse(*data_args, "--accelerator", "cpu", "--devices", "1")
    assert cli.parser.parse_args(["--config", str(config), *data_args])
    cli = parse("--config", str(config), *data_args, "--accelerator", "cpu", "--strategy", "auto")
    model = cli.model.eval()
    if not model.hparams.compile:  # compiling takes long; test_scale.py trains a compiled model
        assert model(model.example_input_array).shape[-1] == cli.datamodule.num_classes


class SeesCallbacks(Callback):
    """Records the classes of the callbacks a run has."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.classes = {type(callback) for callback in trainer.callbacks}


def test_every_callback_is_in_the_run_config_and_a_flag_switches_it_off(train: Callable) -> None:
    seen = SeesCallbacks()
    train("--epoch_line", "null", "--throughput", "null", callbacks=[seen])
    (saved,) = Path("runs").rglob("config.yaml")
    config = yaml.safe_load(saved.read_text())
    on = {key for key in CALLBACKS if config[key] is not None}
    # The test runs turn the bar off (--trainer.enable_progress_bar false): no bar either;
    # the average of the weights and the frozen backbone are off unless asked for.
    off = {"epoch_line", "throughput", "progress_bar", "ema", "freeze_backbone"}
    assert on == set(CALLBACKS) - off
    assert {CALLBACKS[key] for key in on} <= seen.classes
    assert not {EpochLine, ThroughputMonitor, TQDMProgressBar} & seen.classes
