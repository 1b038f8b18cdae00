"""Fork and edit: a new dataset, network, loss or augmentation is one new file plus one flag.

Each test writes the file a user would write into the package, runs what the README runs,
and removes the file again.
"""

import importlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import yaml
from conftest import FAST
from lightning.pytorch import Callback
{%- if cookiecutter.deploy == "yes" %}
from PIL import Image
{%- endif %}

import {{ cookiecutter.package_name }}
from {{ cookiecutter.package_name }}.kit.checkpoint import data_state, load_checkpoint
{%- if cookiecutter.deploy == "yes" %}
from {{ cookiecutter.package_name }}.kit.export import main as export
from {{ cookiecutter.package_name }}.kit.predict import main as predict
{%- endif %}
from {{ cookiecutter.package_name }}.kit.train import main

PACKAGE = Path({{ cookiecutter.package_name }}.__file__).parent

# A data module of the contract (datamodule.ImageDataModule), as a user would write one:
# squares and discs drawn at random places, decoded once into memory like the digits.
SHAPES = '''"""Squares and discs, drawn at random places: 16x16 grey images."""

import torch
from torch import Tensor
from torchvision.transforms import v2

from .kit.datamodule import InMemoryDataModule, TensorImages


def drawn(count: int, seed: int) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (count,), generator=generator)
    centres = torch.randint(5, 11, (count, 2), generator=generator)
    rows, columns = torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij")
    dy = rows - centres[:, 0, None, None]
    dx = columns - centres[:, 1, None, None]
    square = (dy.abs() <= 3) & (dx.abs() <= 3)
    disc = dy**2 + dx**2 <= 12
    shapes = torch.where(labels[:, None, None] == 0, square, disc)
    return (shapes * 255).to(torch.uint8).unsqueeze(1), labels


class Shapes(InMemoryDataModule):
    """Two classes of shapes; a new, seeded set for the test split."""

    mean, std = (0.17,), (0.37,)

    @staticmethod
    def prediction_transform(input_shape: tuple[int, int, int]) -> v2.Transform:
        return v2.Compose(
            [
                v2.Grayscale(),
                v2.Resize(input_shape[1:], antialias=True),
                v2.ToImage(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(Shapes.mean, Shapes.std),
            ]
        )

    def __init__(
        self, batch_size: int = 32, num_workers: int | None = 0, val_fraction: float = 0.2,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size, num_workers, val_fraction, seed)
        self.class_names = ("square", "disc")
        self.input_shape = (1, 16, 16)
        self.normalise = v2.Compose(
            [v2.ToDtype(torch.float32, scale=True), v2.Normalize(self.mean, self.std)]
        )

    def setup(self, stage: str | None = None) -> None:
        images = TensorImages(*drawn(320, self.seed))
        self.train_set, self.val_set = self.split(images, images)
        self.test_set = TensorImages(*drawn(64, self.seed + 1))
'''

# A network as a user would write one: a plain nn.Module, (channels, classes) -> module.
MLP = '''"""A small multilayer perceptron."""

from torch import nn


class MLP(nn.Sequential):
    def __init__(self, in_channels: int, num_classes: int, hidden: int = 64) -> None:
        layers = [nn.Flatten(), nn.LazyLinear(hidden), nn.ReLU(), nn.Linear(hidden, num_classes)]
        super().__init__(*layers)
'''

# A loss as a user would write one (focal loss: hard examples weigh more). `calls` records
# whether each call had gradients on, so the test sees training and evaluation use it.
FOCAL = '''"""Focal loss (Lin et al., 2017): cross-entropy scaled down on confident predictions."""

import torch
from torch import Tensor, nn
from torch.nn import functional as F


class FocalLoss(nn.Module):
    calls: list[bool] = []

    def __init__(self, gamma: float = 2.0) -> None:
        super().__init__()
        self.gamma = gamma

    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        FocalLoss.calls.append(torch.is_grad_enabled())
        log_p = F.log_softmax(logits, dim=-1).gather(1, labels[:, None]).squeeze(1)
        return (-((1 - log_p.exp()) ** self.gamma) * log_p).mean()
'''
{%- if cookiecutter.dataset == "image_folder" %}

# One more augmentation as a user would add it: small random rotations before the crops.
# `calls` counts the training images it saw.
ROTATED = '''"""The project's images, also rotated by up to 15 degrees while training."""

from torchvision.transforms import v2

from .data import DataModule


class Rotated(DataModule):
    calls: list[int] = []

    def train_transform(self) -> v2.Transform:
        return v2.Compose([v2.Lambda(self.count), v2.RandomRotation(15), super().train_transform()])

    @staticmethod
    def count(image):
        Rotated.calls.append(1)
        return image
'''
{%- else %}

# One more augmentation as a user would add it: small random rotations after the project's
# own. `calls` records the size of each batch it saw.
ROTATED = '''"""The project's images, also rotated by up to 15 degrees while training."""

from torch import Tensor

from .batch_augment import random_affine
from .data import DataModule


class Rotated(DataModule):
    calls: list[int] = []

    def augment(self, images: Tensor) -> Tensor:
        Rotated.calls.append(len(images))
        return random_affine(super().augment(images), degrees=15, translate=0.0)
'''
{%- endif %}


@pytest.fixture
def new_module() -> Iterator[Callable[[str, str], str]]:
    """Write a module into the package, as a fork would; return its import name."""
    written = []

    def write(name: str, source: str) -> str:
        # A prefix of its own: a fork may have written the README's examples (focal.py, ...).
        name = f"fork_test_{name}"
        path = PACKAGE / f"{name}.py"
        assert not path.exists(), f"{path} exists: the test would overwrite it"
        path.write_text(source)
        written.append(path)
        importlib.invalidate_caches()
        return f"{{ cookiecutter.package_name }}.{name}"

    yield write
    for path in written:
        path.unlink()
        sys.modules.pop(f"{{ cookiecutter.package_name }}.{path.stem}", None)


def test_a_new_dataset_is_one_file_and_one_flag(
    new_module: Callable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shapes = new_module("shapes", SHAPES) + ".Shapes"
    monkeypatch.chdir(tmp_path)
    metrics = main(["--data", shapes, *FAST, "--max_epochs", "4"])
    assert metrics["test/acc"] > 0.5  # better than chance on two classes
    best = Path(json.loads(next(Path("runs").rglob("test_metrics.json")).read_text())["checkpoint"])
    saved = data_state(load_checkpoint(best), best)
    assert (saved["class_path"], saved["class_names"]) == (shapes, ["square", "disc"])
{%- if cookiecutter.deploy == "yes" %}

    # Predict and export need no data: the checkpoint names its data module.
    square = Image.new("RGB", (16, 16))
    square.paste((255, 255, 255), (4, 4, 11, 11))
    square.save(tmp_path / "square.png")
    (artifact,) = export(["--ckpt_path", str(best), "--format", "onnx"])
    metadata = json.loads(artifact.with_name(artifact.name + ".json").read_text())
    assert (metadata["data_class"], metadata["mean"]) == (shapes, [0.17])
    for model in (best, artifact):
        output = tmp_path / f"{model.suffix[1:]}.json"
        image = str(tmp_path / "square.png")
        assert predict(["--model", str(model), image, "--output", str(output)]) == 0
        (row,) = json.loads(output.read_text())
        assert row["class"] in ("square", "disc")
{%- endif %}


def test_a_new_network_is_one_file_and_one_flag(new_module: Callable, train: Callable) -> None:
    mlp = new_module("mlp", MLP) + ".MLP"
    train("--model.backbone", mlp, "--model.backbone.hidden", "32")
    best = Path(json.loads(next(Path("runs").rglob("test_metrics.json")).read_text())["checkpoint"])
    weights = load_checkpoint(best)["state_dict"]
    assert weights["backbone.1.weight"].shape[0] == 32  # the MLP's hidden layer was trained
    assert torch.isfinite(weights["backbone.3.weight"]).all()


def test_a_new_loss_is_one_file_and_one_flag(new_module: Callable, train: Callable) -> None:
    focal = new_module("focal", FOCAL) + ".FocalLoss"
    module = importlib.import_module(focal.rpartition(".")[0])
    metrics = train("--model.loss", focal, "--model.loss.gamma", "3")
    config = yaml.safe_load(next(Path("runs").rglob("config.yaml")).read_text())
    assert config["model"]["loss"] == {"class_path": focal, "init_args": {"gamma": 3.0}}
    calls = module.FocalLoss.calls
    assert True in calls and False in calls  # training steps, and validation and test
    assert torch.isfinite(torch.tensor(metrics["test/loss"]))


class ServedImages(Callback):
    """Counts the images of the training batches."""

    def __init__(self) -> None:
        self.images = 0

    def on_train_batch_start(self, trainer: object, module: object, batch: tuple, i: int) -> None:
        self.images += len(batch[1])


def test_a_new_augmentation_is_one_file_and_one_flag(
    new_module: Callable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data_args: list[str]
) -> None:
    rotated = new_module("rotated", ROTATED) + ".Rotated"
    module = importlib.import_module(rotated.rpartition(".")[0])
    monkeypatch.chdir(tmp_path)
    served = ServedImages()
    main(["--data", rotated, *FAST, *data_args], callbacks=[served])
    config = yaml.safe_load(next(Path("runs").rglob("config.yaml")).read_text())
    assert config["data"]["class_path"] == rotated
    assert served.images > 0
{%- if cookiecutter.dataset == "image_folder" %}
    # Every training image, and no other (+1: the start-up check of the input shape reads one
    # training image).
    assert served.images <= len(module.Rotated.calls) <= served.images + 1
{%- else %}
    assert sum(module.Rotated.calls) == served.images  # every training batch, and no other
{%- endif %}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "from .kit.datamodule import ImageDataModule\n"
            "class Bare(ImageDataModule):\n"
            "    def __init__(self, batch_size: int = 8, num_workers: int = 0) -> None:\n"
            "        super().__init__(batch_size, num_workers, 0.1, 0)\n",
            "data module Bare does not set class_names, input_shape, mean, std, "
            "prediction_transform (the contract in datamodule.ImageDataModule",
        ),
        (
            "from .data import DataModule\n"
            "class OwnLoader(DataModule):\n"
            "    def train_dataloader(self):\n"
            "        return super().train_dataloader()\n",
            "data module OwnLoader overrides train_dataloader, which would lose the loader's "
            "position on resume; override make_loader(dataset, shuffle) instead",
        ),
    ],
    ids=["missing members", "own train_dataloader"],
)
def test_a_data_module_outside_the_contract_stops_in_one_line(
    new_module: Callable,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    data_args: list[str],
    source: str,
    message: str,
) -> None:
    name = new_module("own_data", source) + "." + source.split("class ")[1].split("(")[0]
    monkeypatch.chdir(tmp_path)
    own_data = data_args if "from .data import" in source else []  # the project's data module
    with pytest.raises(SystemExit) as stop:
        main(["--data", name, *FAST, *own_data])
    assert str(stop.value).startswith(f"error: {message}")
    assert "\n" not in str(stop.value)
    assert not Path("runs").exists()  # refused before a run folder was made
