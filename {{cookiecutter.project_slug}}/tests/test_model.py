"""The network and the LightningModule, without the command line: the model
configs/default.yaml describes (its network, loss, optimizer), for the test data."""

import logging
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from lightning import Trainer
from lightning.pytorch.callbacks import EarlyStopping
from torch import nn

from {{ cookiecutter.package_name }}.backbones import ConvNet, TimmBackbone, TorchvisionBackbone
from {{ cookiecutter.package_name }}.data import DataModule
from {{ cookiecutter.package_name }}.kit.cli import arguments_of, build_model
from {{ cookiecutter.package_name }}.kit.errors import ConfigError
from {{ cookiecutter.package_name }}.kit.layers import last_linear
from {{ cookiecutter.package_name }}.model import ImageClassifier

PENALTY = "--model.backbone.init_args.head_penalty"


@pytest.fixture
def penalty(defaults: dict) -> Callable[[str], list[str]]:
    """penalty(value): the flags that put the L2 penalty on the classifier of the configured
    network, or of ConvNet if that network takes no head_penalty."""
    network = defaults["model"]["backbone"]["class_path"]
    takes_it = "head_penalty" in arguments_of(network)
    convnet = ["--model.backbone", f"{ConvNet.__module__}.ConvNet"]
    return lambda value: [*([] if takes_it else convnet), PENALTY, value]


@pytest.fixture
def configured(
    data_args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., ImageClassifier]:
    """configured(*flags): the model `python train.py *flags` would train on the test data."""
    monkeypatch.chdir(tmp_path)

    def build(*flags: str) -> ImageClassifier:
        return build_model(["--accelerator", "cpu", "--devices", "1", *data_args, *flags])

    return build


@pytest.fixture
def datamodule(make_datamodule: Callable[..., DataModule]) -> DataModule:
    return make_datamodule(batch_size=16)


def test_model_returns_logits_and_predict_returns_probabilities(
    configured: Callable[..., ImageClassifier], datamodule: DataModule
) -> None:
    model = configured().eval()
    x = torch.randn(5, *datamodule.input_shape)
    logits = model(x)
    assert logits.shape == (5, datamodule.num_classes)
    assert not torch.allclose(logits.sum(dim=-1), torch.ones(5))  # raw logits, no softmax
    probabilities = model.predict_step(x, 0)
    assert torch.allclose(probabilities.sum(dim=-1), torch.ones(5), atol=1e-5)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small"])
def test_torchvision_backbones_fit_any_channels_and_classes(
    name: str, datamodule: DataModule
) -> None:
    channels = datamodule.input_shape[0]
    backbone = TorchvisionBackbone(channels, 7, name=name)
    backbone.eval()
    assert backbone(torch.randn(2, channels, 32, 32)).shape == (2, 7)


def test_a_timm_backbone_reads_offline_weights_and_fits_the_data(
    datamodule: DataModule, tmp_path: Path
) -> None:
    timm = pytest.importorskip("timm")  # the timm extra, which dev includes
    pretrained = timm.create_model("resnet10t")  # 3 channels, ImageNet's 1000 classes
    torch.save(pretrained.state_dict(), tmp_path / "resnet10t.pth")
    channels, classes = datamodule.input_shape[0], datamodule.num_classes
    path = str(tmp_path / "resnet10t.pth")
    backbone = TimmBackbone(channels, classes, "resnet10t", checkpoint_path=path)
    inner = "layer1.0.conv1.weight"  # read from the file; the classifier starts new
    assert torch.equal(backbone.net.get_parameter(inner), pretrained.get_parameter(inner))
    assert backbone(torch.randn(2, *datamodule.input_shape)).shape == (2, classes)
    # One-line errors (ConfigError) naming the argument, before anything is built or read.
    with pytest.raises(ConfigError, match="'no_such_net' is not a timm model"):
        TimmBackbone(3, 2, "no_such_net")
    with pytest.raises(ConfigError, match=r"checkpoint_path \S+nowhere.pth is not a file"):
        TimmBackbone(3, 2, "resnet10t", checkpoint_path=str(tmp_path / "nowhere.pth"))


def test_unknown_torchvision_backbone_or_weights_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match="resnet18"):
        TorchvisionBackbone(3, 10, name="resnet19")
    accepted = r"weights 'IMAGENET1K_V9' of resnet18: accepted: DEFAULT, IMAGENET1K_V1"
    with pytest.raises(ConfigError, match=accepted):
        TorchvisionBackbone(3, 10, name="resnet18", weights="IMAGENET1K_V9")


def test_conv_net_is_a_plain_module_for_any_depth() -> None:
    for stages in (1, 2, 3):
        net = ConvNet(3, 4, width=8, stages=stages)
        assert isinstance(net, nn.Module) and net(torch.randn(2, 3, 8, 8)).shape == (2, 4)


def test_channels_last_changes_the_layout_not_the_results(
    configured: Callable[..., ImageClassifier], datamodule: DataModule
) -> None:
    fast = configured("--model.channels_last", "true").eval()
    plain = configured("--model.channels_last", "false").eval()
    plain.load_state_dict(fast.state_dict())
    fast_convs = [m for m in fast.backbone.modules() if isinstance(m, nn.Conv2d)]
    plain_convs = [m for m in plain.backbone.modules() if isinstance(m, nn.Conv2d)]
    nhwc = torch.channels_last
    x = torch.randn(4, *datamodule.input_shape)
    assert all(conv.weight.is_contiguous(memory_format=nhwc) for conv in fast_convs)
    assert all(conv.weight.is_contiguous() for conv in plain_convs)
    # Where the two layouts differ: weights with several input channels and a kernel wider than
    # one pixel, and the feature maps such a convolution makes (several channels and pixels).
    telling = [c for c in fast_convs if c.weight[0, 0].numel() > 1 and c.weight.shape[1] > 1]
    assert not any(conv.weight.is_contiguous() for conv in telling)
    maps: list[torch.Tensor] = []
    for conv in telling:
        conv.register_forward_hook(lambda module, given, output: maps.append(output))
    fast(x)
    telling_maps = [m for m in maps if m.shape[1] > 1 and m.shape[2] * m.shape[3] > 1]
    assert telling_maps or not fast_convs, "no feature map tells the layouts apart"
    assert all(m.is_contiguous(memory_format=nhwc) and not m.is_contiguous() for m in telling_maps)
    torch.testing.assert_close(fast(x), plain(x))
    # Weights load across the two layouts and keep the layout of the model they load into.
    fast.load_state_dict(plain.state_dict())
    assert all(conv.weight.is_contiguous(memory_format=nhwc) for conv in fast_convs)
    assert not any(conv.weight.is_contiguous() for conv in telling)


def test_channels_last_leaves_lazy_parameters_to_their_first_forward() -> None:
    def lazy(in_channels: int, num_classes: int) -> nn.Module:
        convs = [nn.Conv2d(in_channels, 4, 3), nn.LazyConv2d(4, 3)]
        return nn.Sequential(*convs, nn.Flatten(), nn.LazyLinear(num_classes))

    model = ImageClassifier(10, (3, 8, 8), backbone=lazy)
    assert model.backbone[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not model.backbone[0].weight.is_contiguous()
    assert model(torch.randn(2, 3, 8, 8)).shape == (2, 10)


# training_step called outside a Trainer: its self.log calls warn and do nothing.
@pytest.mark.filterwarnings("ignore:You are trying to .self.log")
def test_a_penalty_that_a_module_carries_joins_the_gradient(
    configured: Callable[..., ImageClassifier],
    penalty: Callable[[str], list[str]],
    datamodule: DataModule,
) -> None:
    penalised, plain = configured(*penalty("0.5")), configured(*penalty("0"))
    plain.load_state_dict(penalised.state_dict())
    x = torch.randn(8, *datamodule.input_shape)
    y = torch.randint(datamodule.num_classes, (8,))
    for model in (penalised, plain):
        torch.manual_seed(0)  # the same dropout in both
        model.training_step((x, y), 0).backward()
    classifier = f"backbone.{last_linear(penalised.backbone)}"
    for name, parameter in penalised.named_parameters():
        if parameter.grad is None:  # a parameter the forward pass does not use
            assert plain.get_parameter(name).grad is None, name
            continue
        difference = parameter.grad - plain.get_parameter(name).grad
        if name == f"{classifier}.weight":
            # d/dw of 0.5 * sum(w ** 2) is w: the penalty's share of the gradient, nothing else.
            torch.testing.assert_close(difference, parameter.detach(), atol=1e-6, rtol=0)
        else:
            torch.testing.assert_close(difference, torch.zeros_like(difference), msg=name)
    assert set(plain.regularization()) == set()  # a penalty of 0 adds no term


def test_a_penalty_that_a_module_carries_is_logged_by_a_readable_name(
    configured: Callable[..., ImageClassifier],
    penalty: Callable[[str], list[str]],
    datamodule: DataModule,
) -> None:
    model = configured(*penalty("0.5"))
    (name,) = model.regularization()
    assert not re.search(r"(^|\.)\d+(\.|$)", name), f"{name}: a position, not a name"
    # Step values are logged on the steps that write to the loggers: here, every step.
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2, log_every_n_steps=1)
    trainer.fit(model, datamodule=datamodule)
    logged = trainer.callback_metrics
    assert float(logged[f"train/regularization/{name}_step"]) > 0
    assert float(logged["train/regularization_epoch"]) == pytest.approx(
        float(logged[f"train/regularization/{name}_epoch"])
    )


def test_a_schedule_too_short_for_its_warmup_says_so_once(
    configured: Callable[..., ImageClassifier],
    datamodule: DataModule,
    caplog: pytest.LogCaptureFixture,
) -> None:
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2)
    warmup = configured("--model.scheduler", "null", "--model.warmup_fraction", "0.05")
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        trainer.fit(warmup, datamodule=datamodule)
    notes = [record.message for record in caplog.records if "optimizer steps" in record.message]
    assert notes == [
        "the learning rate warms up over the first 1 of only 2 optimizer steps (fewer than "
        "100), then decays to zero: train longer (--max_epochs), use smaller batches "
        "(--data.batch_size) or a constant rate (--model.scheduler)"
    ]
    caplog.clear()
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2)
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        constant = configured("--model.scheduler", "torch.optim.lr_scheduler.ConstantLR")
        trainer.fit(constant, datamodule=datamodule)
    assert not [record for record in caplog.records if "optimizer steps" in record.message]


def test_validation_logs_the_monitored_metric_and_the_metrics_are_right(
    configured: Callable[..., ImageClassifier], datamodule: DataModule, monitored: str
) -> None:
    model = configured().eval()
    trainer = Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    (logged,) = trainer.validate(model, datamodule=datamodule, verbose=False)
    assert monitored in logged, f"{monitored} is monitored but not logged: {sorted(logged)}"
    # By hand, over the same images: the share classified correctly, and F1 per class (the
    # classes that occur among labels or predictions), averaged.
    with torch.no_grad():
        batches = [datamodule.on_after_batch_transfer(b, 0) for b in datamodule.val_dataloader()]
        pairs = [(model(x).argmax(-1), y) for x, y in batches]
    predicted, labels = (torch.cat(column) for column in zip(*pairs, strict=True))
    assert logged["val/acc"] == pytest.approx(float((predicted == labels).float().mean()))
    scores = []
    for label in set(labels.tolist()) | set(predicted.tolist()):
        hits = int(((predicted == label) & (labels == label)).sum())
        misses = int((predicted == label).sum()) + int((labels == label).sum()) - 2 * hits
        scores.append(2 * hits / (2 * hits + misses))
    assert logged["val/f1"] == pytest.approx(sum(scores) / len(scores), abs=1e-5)


def test_overfitting_one_batch_drives_the_loss_near_zero(
    configured: Callable[..., ImageClassifier], datamodule: DataModule
) -> None:
    model = configured(
        "--model.optimizer.init_args.lr", "3e-3",
        "--model.scheduler", "torch.optim.lr_scheduler.ConstantLR",
        "--model.scheduler.init_args.factor", "1.0",
        # No smoothing: it keeps a perfect fit's loss near 0.5.
        "--model.loss.init_args.label_smoothing", "0",
    )  # fmt: skip
    # Stops as soon as the loss is low enough: a network that learns more slowly than the
    # default one (an MLP, say) gets more steps, not a failure.
    reached = EarlyStopping(
        "train/loss_epoch", stopping_threshold=0.05, patience=500, check_on_train_epoch_end=True
    )
    trainer = quiet_trainer(overfit_batches=1, max_epochs=500, callbacks=[reached])
    trainer.fit(model, datamodule=datamodule)
    assert trainer.callback_metrics["train/loss_epoch"] < 0.05


def quiet_trainer(**options: object) -> Trainer:
    """A CPU Trainer that trains only: no validation, logger, checkpoints, bar or summary."""
    return Trainer(
        accelerator="cpu",
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **options,
    )
