"""The network and the LightningModule, without the command line."""

import logging
from collections.abc import Callable
from functools import partial
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from lightning import Trainer
from torch import nn

from {{ cookiecutter.package_name }}.backbones import ConvNet, TimmBackbone, TorchvisionBackbone
from {{ cookiecutter.package_name }}.data import DataModule
from {{ cookiecutter.package_name }}.model import ImageClassifier, warmup_cosine


def model_for(dm: DataModule, **kwargs) -> ImageClassifier:
    return ImageClassifier(dm.num_classes, dm.input_shape, **kwargs)


@pytest.fixture
def datamodule(make_datamodule: Callable[..., DataModule]) -> DataModule:
    return make_datamodule(batch_size=16)


def test_model_returns_logits_and_predict_returns_probabilities(datamodule: DataModule) -> None:
    model = model_for(datamodule).eval()
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
    with pytest.raises(ValueError, match="'no_such_net' is not a timm model"):
        TimmBackbone(3, 2, "no_such_net")


def test_unknown_torchvision_backbone_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="resnet18"):
        TorchvisionBackbone(3, 10, name="resnet19")


def test_the_default_network_is_a_plain_module_for_any_depth() -> None:
    for stages in (1, 2, 3):
        net = ConvNet(3, 4, width=8, stages=stages)
        assert isinstance(net, nn.Module) and net(torch.randn(2, 3, 8, 8)).shape == (2, 4)


def test_channels_last_changes_the_layout_not_the_results(datamodule: DataModule) -> None:
    torch.manual_seed(0)
    fast = model_for(datamodule).eval()  # channels_last by default
    plain = model_for(datamodule, channels_last=False).eval()
    plain.load_state_dict(fast.state_dict())
    fast_convs = [m for m in fast.backbone.modules() if isinstance(m, nn.Conv2d)]
    plain_convs = [m for m in plain.backbone.modules() if isinstance(m, nn.Conv2d)]
    nhwc = torch.channels_last
    assert all(conv.weight.is_contiguous(memory_format=nhwc) for conv in fast_convs)
    assert not all(conv.weight.is_contiguous() for conv in fast_convs)
    assert all(conv.weight.is_contiguous() for conv in plain_convs)
    x = torch.randn(4, *datamodule.input_shape)
    # Stem, pool, then the first block whose weights have more than one input channel.
    feature_maps = fast.backbone.features[:3](x)
    assert feature_maps.is_contiguous(memory_format=nhwc) and not feature_maps.is_contiguous()
    torch.testing.assert_close(fast(x), plain(x))
    # Weights load across the two layouts and keep the layout of the model they load into.
    fast.load_state_dict(plain.state_dict())
    assert all(conv.weight.is_contiguous(memory_format=nhwc) for conv in fast_convs)
    assert not all(conv.weight.is_contiguous() for conv in fast_convs)


def test_channels_last_leaves_lazy_parameters_to_their_first_forward() -> None:
    def lazy(in_channels: int, num_classes: int) -> nn.Module:
        convs = [nn.Conv2d(in_channels, 4, 3), nn.LazyConv2d(4, 3)]
        return nn.Sequential(*convs, nn.Flatten(), nn.LazyLinear(num_classes))

    model = ImageClassifier(10, (3, 8, 8), backbone=lazy)
    assert model.backbone[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not model.backbone[0].weight.is_contiguous()
    assert model(torch.randn(2, 3, 8, 8)).shape == (2, 10)


def test_warmup_then_cosine_decay() -> None:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = warmup_cosine(optimizer, total_steps=100, warmup_fraction=0.1)
    lrs = []
    for _ in range(100):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(0.01)
    assert lrs[10] == pytest.approx(1.0)
    assert all(a < b for a, b in pairwise(lrs[:11]))  # rising during warmup
    assert all(a >= b for a, b in pairwise(lrs[10:]))  # falling afterwards
    assert lrs[-1] < 0.01


# training_step called outside a Trainer: its self.log calls warn and do nothing.
@pytest.mark.filterwarnings("ignore:You are trying to .self.log")
def test_a_penalty_that_a_module_carries_joins_the_gradient(datamodule: DataModule) -> None:
    torch.manual_seed(0)
    penalised = model_for(datamodule, backbone=partial(ConvNet, dropout=0.0, head_penalty=0.5))
    plain = model_for(datamodule, backbone=partial(ConvNet, dropout=0.0))
    plain.load_state_dict(penalised.state_dict())
    x = torch.randn(8, *datamodule.input_shape)
    y = torch.randint(datamodule.num_classes, (8,))
    for model in (penalised, plain):
        model.training_step((x, y), 0).backward()
    head = "backbone.head.1.weight"
    weight, grad = penalised.get_parameter(head), penalised.get_parameter(head).grad
    # d/dw of 0.5 * sum(w ** 2) is w: the penalty's share of the gradient, nothing else.
    assert torch.allclose(grad - plain.get_parameter(head).grad, weight, atol=1e-6)
    conv = "backbone.features.0.0.weight"
    assert torch.allclose(penalised.get_parameter(conv).grad, plain.get_parameter(conv).grad)
    assert set(plain.regularization()) == set()  # a penalty of 0 adds no term


def test_a_penalty_that_a_module_carries_is_logged(datamodule: DataModule) -> None:
    model = model_for(datamodule, backbone=partial(ConvNet, head_penalty=0.5))
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2)
    trainer.fit(model, datamodule=datamodule)
    logged = trainer.callback_metrics
    assert float(logged["train/regularization/head.l2_linear_step"]) > 0
    assert float(logged["train/regularization_epoch"]) == pytest.approx(
        float(logged["train/regularization/head.l2_linear_epoch"])
    )


def test_a_schedule_too_short_for_its_warmup_says_so_once(
    datamodule: DataModule, caplog: pytest.LogCaptureFixture
) -> None:
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2)
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        trainer.fit(model_for(datamodule), datamodule=datamodule)
    notes = [record.message for record in caplog.records if "optimizer steps" in record.message]
    assert notes == [
        "the learning rate warms up for 1 and decays to zero over only 2 optimizer steps (fewer "
        "than 100): train longer (--max_epochs), use smaller batches (--data.batch_size) or a "
        "constant rate (--model.scheduler)"
    ]
    caplog.clear()
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2)
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        constant = model_for(datamodule, scheduler=torch.optim.lr_scheduler.ConstantLR)
        trainer.fit(constant, datamodule=datamodule)
    assert not [record for record in caplog.records if "optimizer steps" in record.message]


def test_overfitting_one_batch_drives_the_loss_near_zero(datamodule: DataModule) -> None:
    torch.manual_seed(0)
    model = model_for(
        datamodule,
        optimizer=partial(torch.optim.AdamW, lr=3e-3),
        scheduler=partial(torch.optim.lr_scheduler.ConstantLR, factor=1.0),
        loss=torch.nn.CrossEntropyLoss,  # no smoothing: it keeps a perfect fit's loss near 0.5
    )
    trainer = quiet_trainer(overfit_batches=1, max_epochs=100)
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
