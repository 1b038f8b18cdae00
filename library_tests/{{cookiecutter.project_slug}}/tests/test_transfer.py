"""Starting from other weights (--init_from): a run's checkpoint or a backbone's state_dict."""

from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import safetensors.torch
import torch
import yaml
from lightning import Callback, LightningModule, Trainer
from logged import scalars
from test_model import quiet_trainer

from {{ cookiecutter.package_name }}.backbones import ConvNet
from {{ cookiecutter.package_name }}.data import DataModule
from {{ cookiecutter.package_name }}.kit.callbacks import FreezeBackbone
from {{ cookiecutter.package_name }}.kit.checkpoint import start_from
{%- if cookiecutter.dataset == "digits" %}
from {{ cookiecutter.package_name }}.kit.datamodule import TensorImages
{%- endif %}
from {{ cookiecutter.package_name }}.kit.errors import ConfigError
from {{ cookiecutter.package_name }}.model import ImageClassifier

RUNS = Path("runs/default")
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture
def shape(make_datamodule: Callable[..., DataModule]) -> tuple[int, int, int]:
    return make_datamodule().input_shape


def same_weights(model: ImageClassifier, weights: dict[str, torch.Tensor]) -> bool:
    return all(
        torch.equal(value, weights[key]) for key, value in model.backbone.state_dict().items()
    )


def test_a_run_starts_from_another_runs_best_checkpoint(
    train: Callable, caplog: pytest.LogCaptureFixture
) -> None:
    train()
    (best,) = (RUNS / "version_0" / "checkpoints").glob("epoch*.ckpt")
    saved = torch.load(best, weights_only=True)["state_dict"]
    started = []  # the weights as the second run starts to train
    train("--init_from", str(best), callbacks=[AtEpochStart(started)])
    assert all(torch.equal(started[0][key], value) for key, value in saved.items())
    assert f"Started from {best}" in caplog.text
    config = yaml.safe_load((RUNS / "version_1" / "config.yaml").read_text())
    assert config["init_from"] == str(best)  # --config config.yaml repeats the run


class AtEpochStart(Callback):
    """Keeps a copy of the model's weights as each training epoch starts."""

    def __init__(self, into: list[dict[str, torch.Tensor]]) -> None:
        self.into = into

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.into.append({k: v.clone() for k, v in pl_module.state_dict().items()})


def test_a_classifier_for_another_class_count_starts_new(
    shape: tuple[int, int, int], tmp_path: Path
) -> None:
    pretrained = ImageClassifier(10, shape)
    torch.save({"state_dict": pretrained.state_dict()}, tmp_path / "ten.ckpt")
    model = ImageClassifier(3, shape)
    fresh_head = {k: v.clone() for k, v in model.backbone.head.state_dict().items()}

    said = start_from(model, tmp_path / "ten.ckpt")

    assert said.endswith("the classifier head.1 starts new (10 classes there, 3 here)")
    features = pretrained.backbone.features.state_dict()
    assert all(torch.equal(v, features[k]) for k, v in model.backbone.features.state_dict().items())
    assert all(torch.equal(v, fresh_head[k]) for k, v in model.backbone.head.state_dict().items())


def test_another_network_is_refused_naming_the_layers(
    shape: tuple[int, int, int], tmp_path: Path, train: Callable
) -> None:
    wider = ImageClassifier(3, shape, backbone=partial(ConvNet, width=8, stages=1))
    torch.save({"state_dict": wider.state_dict()}, tmp_path / "other.ckpt")
    with pytest.raises(ConfigError, match=r"does not fit the backbone: features\.\S+ \("):
        start_from(ImageClassifier(3, shape), tmp_path / "other.ckpt")
    with pytest.raises(SystemExit, match=r"^error: --init_from \S+other.ckpt does not fit"):
        train("--init_from", str(tmp_path / "other.ckpt"))
    assert not RUNS.exists()  # refused before a run folder was made


class Wrapping(torch.nn.Module):
    """A backbone that wraps a network of another library, as TimmBackbone does (`net`)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__()
        self.net = ConvNet(*args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_the_state_dict_of_a_wrapped_network_is_a_start_too(
    shape: tuple[int, int, int], tmp_path: Path
) -> None:
    """timm.create_model(...).state_dict(), saved as the README says: keys without `net.`."""
    pretrained = ConvNet(shape[0], 5)  # another class count, as an ImageNet model has
    torch.save(pretrained.state_dict(), tmp_path / "network.pt")
    model = ImageClassifier(3, shape, backbone=Wrapping)
    said = start_from(model, tmp_path / "network.pt")
    assert said.startswith(f"Started from {tmp_path / 'network.pt'}: ")
    assert "the classifier net." in said and "starts new (5 classes there, 3 here)" in said
    loaded = model.backbone.net.state_dict()
    kept = [key for key in loaded if key in pretrained.state_dict()]
    same = [k for k in kept if torch.equal(loaded[k], pretrained.state_dict()[k])]
    assert len(same) == len(kept) - 2  # all but the classifier's weight and bias


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_a_backbone_state_dict_is_a_start_too(
    shape: tuple[int, int, int], tmp_path: Path, suffix: str
) -> None:
    pretrained = ImageClassifier(3, shape)
    weights = {k: v.contiguous() for k, v in pretrained.backbone.state_dict().items()}
    path = tmp_path / f"backbone{suffix}"
    if suffix == ".pt":
        torch.save(weights, path)
    else:
        safetensors.torch.save_file(weights, path)
    model = ImageClassifier(3, shape)
    assert not same_weights(model, weights)
    assert start_from(model, path) == f"Started from {path}: {len(weights)} tensors of the backbone"
    assert same_weights(model, weights)


def test_unreadable_weights_are_refused_in_one_line(tmp_path: Path, shape: tuple) -> None:
    (tmp_path / "broken.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigError, match=r"broken.safetensors is not a readable safetensors file"):
        start_from(ImageClassifier(3, shape), tmp_path / "broken.safetensors")
    torch.save({"model": torch.nn.Linear(2, 2)}, tmp_path / "pickled.pt")  # code, not weights
    with pytest.raises(ConfigError, match=r"pickled.pt was refused: it holds a pickled Python"):
        start_from(ImageClassifier(3, shape), tmp_path / "pickled.pt")


def test_a_frozen_backbone_trains_its_classifier_alone_until_it_thaws(
    make_datamodule: Callable[..., DataModule],
) -> None:
    datamodule = make_datamodule(batch_size=16)
    model = ImageClassifier(datamodule.num_classes, datamodule.input_shape)
    starts: list[dict[str, torch.Tensor]] = []
    callbacks = [FreezeBackbone(epochs=2), AtEpochStart(starts)]
    quiet_trainer(max_epochs=3, limit_train_batches=2, callbacks=callbacks).fit(model, datamodule)
    starts.append(model.state_dict())
    conv, head = "backbone.features.0.0.weight", "backbone.head.1.weight"
    assert torch.equal(starts[0][conv], starts[2][conv])  # frozen for two epochs
    assert not torch.equal(starts[2][conv], starts[3][conv])  # then trained
    assert not torch.equal(starts[0][head], starts[1][head])  # the classifier from the start


def test_a_run_no_longer_than_the_frozen_epochs_says_so(
    make_datamodule: Callable[..., DataModule], caplog: pytest.LogCaptureFixture
) -> None:
    datamodule = make_datamodule(batch_size=16)
    model = ImageClassifier(datamodule.num_classes, datamodule.input_shape)
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=1, callbacks=[FreezeBackbone(2)])
    trainer.fit(model, datamodule)
    assert "freeze_backbone.epochs 2 >= max_epochs 2: only the classifier trains" in caplog.text


def test_freezing_a_network_without_a_classifier_layer_is_refused(
    make_datamodule: Callable[..., DataModule],
) -> None:
    def no_linear(in_channels: int, num_classes: int) -> torch.nn.Module:
        pooled = [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()]
        return torch.nn.Sequential(torch.nn.Conv2d(in_channels, num_classes, 1), *pooled)

    datamodule = make_datamodule(batch_size=16)
    model = ImageClassifier(datamodule.num_classes, datamodule.input_shape, backbone=no_linear)
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2, callbacks=[FreezeBackbone()])
    with pytest.raises(ConfigError, match=r"^freeze_backbone: the optimizer has no parameter"):
        trainer.fit(model, datamodule)
    assert trainer.global_step == 0


def test_freezing_a_network_without_a_classifier_layer_is_refused_before_any_data_loads(
    train: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1x1 convolution as the whole network: nothing before a linear layer to freeze."""
    loaded = []
    monkeypatch.setattr(DataModule, "prepare_data", lambda self: loaded.append("prepare"))
    monkeypatch.setattr(DataModule, "setup", lambda self, stage: loaded.append(stage))
    with pytest.raises(SystemExit) as exit_info:
        train(
            "--config", str(CONFIGS / "model" / "finetune.yaml"),
            "--model.backbone", "torch.nn.Conv2d", "--model.backbone.kernel_size", "1",
        )  # fmt: skip
    assert str(exit_info.value.code).startswith(
        "error: freeze_backbone: the optimizer has no parameter group named 'features'"
    )
    assert not loaded
    assert not Path("runs").exists()


def test_the_lr_monitor_shows_the_frozen_epochs_and_both_learning_rates(train: Callable) -> None:
    """configs/model/finetune.yaml: frozen for 2 epochs, the features at a tenth of the rate."""
    train("--config", str(CONFIGS / "model" / "finetune.yaml"), "--max_epochs", "3")
    run = RUNS / "version_0"
    classifier = dict(scalars(run, "lr-AdamW/classifier"))
    features = dict(scalars(run, "lr-AdamW/features"))
    assert sorted(classifier) == sorted(features) == list(range(12))  # 3 epochs of 4 steps
    assert all(features[step] == 0 for step in range(8))
    assert all(features[step] == pytest.approx(0.1 * classifier[step]) for step in range(8, 12))
    assert all(rate > 0 for rate in classifier.values())
{%- if cookiecutter.dataset == "digits" %}


class SomeDigits(DataModule):
    """The digits of `classes` only, labelled 0, 1, ... in that order; `per_class` training
    images of each (None: all), a third of the rest held out for the test."""

    def __init__(
        self, classes: list[int], per_class: int | None = None, seed: int = 0, batch_size: int = 16
    ) -> None:
        super().__init__(batch_size=batch_size, seed=seed)
        self.classes, self.per_class = classes, per_class
        self.class_names = tuple(str(digit) for digit in classes)

    def setup(self, stage: str | None = None) -> None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.from_numpy(digits.images).to(torch.uint8).unsqueeze(1)
        labels = torch.from_numpy(digits.target).long()
        relabel = torch.full((10,), -1)
        relabel[self.classes] = torch.arange(len(self.classes))
        test, train = [], []
        for label in self.classes:  # the same held-out images for every seed
            found = (labels == label).nonzero().flatten()
            test += found[: len(found) // 3].tolist()
            rest = found[len(found) // 3 :]
            order = torch.randperm(len(rest), generator=torch.Generator().manual_seed(self.seed))
            train += rest[order[: self.per_class]].tolist()
        self.test_set = TensorImages(images[test], relabel[labels[test]])
        kept = TensorImages(images[train], relabel[labels[train]])
        self.train_set, self.val_set = self.split(kept, kept)


def test_fine_tuning_from_other_classes_beats_training_from_scratch(tmp_path: Path) -> None:
    """Pretrained on the digits 0-4, then fine-tuned on 5-9 from 5 images of each (backbone
    frozen for the first epoch, then at half the rate), against the same network trained from
    scratch with the same budget (8 epochs): higher test accuracy on the same held-out 5-9,
    averaged over 3 seeds."""
    torch.manual_seed(0)
    source = SomeDigits([0, 1, 2, 3, 4], batch_size=64)
    pretrained = ImageClassifier(5, source.input_shape)
    quiet_trainer(max_epochs=15).fit(pretrained, datamodule=source)
    torch.save({"state_dict": pretrained.state_dict()}, tmp_path / "digits0-4.ckpt")

    accuracy: dict[str, list[float]] = {"scratch": [], "fine-tuned": []}
    for seed in range(3):
        target = SomeDigits([5, 6, 7, 8, 9], per_class=5, seed=seed)
        for start, values in accuracy.items():
            torch.manual_seed(seed)
            if start == "scratch":
                model, callbacks = ImageClassifier(5, target.input_shape), []
            else:
                model = ImageClassifier(5, target.input_shape, backbone_lr_factor=0.5)
                start_from(model, tmp_path / "digits0-4.ckpt")
                callbacks = [FreezeBackbone(epochs=1)]
            trainer = quiet_trainer(max_epochs=8, callbacks=callbacks)
            trainer.fit(model, datamodule=target)
            (tested,) = trainer.test(model, datamodule=target, verbose=False)
            values.append(tested["test/acc"])
    mean = {start: sum(values) / len(values) for start, values in accuracy.items()}
    print(f"test/acc on the digits 5-9, 3 seeds: {accuracy}; means {mean}")
    assert mean["fine-tuned"] > mean["scratch"]
{%- endif %}
