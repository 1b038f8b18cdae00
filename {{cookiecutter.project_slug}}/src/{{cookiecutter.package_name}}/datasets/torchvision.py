{#- This file is kept only for the torchvision datasets; the others render it with MNIST's values, then delete it. -#}
{%- set specs = {
    "mnist": {
        "title": "MNIST: 70,000 handwritten digits of 28x28 pixels",
        "cls": "MNIST", "shape": "(1, 28, 28)", "mean": "(0.1307,)", "std": "(0.3081,)",
        "classes": '("0", "1", "2", "3", "4", "5", "6", "7", "8", "9")',
        "augment": "random_affine(images, degrees=10, translate=0.1)", "imports": "random_affine", "augment_doc": "Rotations up to 10 degrees and shifts up to 10% of the size.",
    },
    "fashion_mnist": {
        "title": "Fashion-MNIST: 70,000 clothing images of 28x28 pixels",
        "cls": "FashionMNIST", "shape": "(1, 28, 28)", "mean": "(0.2860,)", "std": "(0.3530,)",
        "classes": '(\n    "T-shirt/top",\n    "Trouser",\n    "Pullover",\n    "Dress",\n    "Coat",\n    "Sandal",\n    "Shirt",\n    "Sneaker",\n    "Bag",\n    "Ankle boot",\n)',
        "augment": "random_horizontal_flip(random_crop(images, padding=2))", "imports": "random_crop, random_horizontal_flip", "augment_doc": "Shifts up to 2 pixels and left-right flips.",
    },
    "cifar10": {
        "title": "CIFAR-10: 60,000 colour images of 32x32 pixels in 10 classes",
        "cls": "CIFAR10", "shape": "(3, 32, 32)", "mean": "(0.4914, 0.4822, 0.4465)", "std": "(0.2470, 0.2435, 0.2616)",
        "classes": '(\n    "airplane",\n    "automobile",\n    "bird",\n    "cat",\n    "deer",\n    "dog",\n    "frog",\n    "horse",\n    "ship",\n    "truck",\n)',
        "augment": "random_horizontal_flip(random_crop(images, padding=4))", "imports": "random_crop, random_horizontal_flip", "augment_doc": "Shifts up to 4 pixels and left-right flips.",
    },
} -%}
{%- set spec = specs.get(cookiecutter.dataset, specs.mnist) -%}
"""{{ spec.title }}, downloaded by torchvision."""

from pathlib import Path

import torch
from torch import Tensor
from torchvision import datasets
from torchvision.transforms import v2

from .batch_augment import {{ spec.imports }}
from .kit.datamodule import InMemoryDataModule, TensorImages
from .kit.errors import ConfigError

DATASET = datasets.{{ spec.cls }}
CLASS_NAMES = {{ spec.classes }}
INPUT_SHAPE = {{ spec.shape }}
# Per-channel mean and std of the training images, pixel values scaled to [0, 1].
MEAN, STD = {{ spec.mean }}, {{ spec.std }}


def eval_transform() -> v2.Transform:
    """Preprocessing for validation, test and prediction (one image or a batch of uint8
    tensors): to float in [0, 1], normalised."""
    return v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])


def prediction_transform(input_shape: tuple[int, int, int]) -> v2.Transform:
    """An RGB image file -> model input: the data's channels and size, then `eval_transform`."""
    channels, height, width = input_shape
    to_channels = [v2.Grayscale()] if channels == 1 else []
    resize = v2.Resize((height, width), antialias=True)
    return v2.Compose([*to_channels, resize, v2.ToImage(), eval_transform()])


def files_it_reads(root: Path) -> str:
    """Which files a machine without the internet copies where, in words."""
{%- if spec.cls == "CIFAR10" %}
    return (
        f"{DATASET.filename} as downloaded, or the {DATASET.base_folder} folder it unpacks to, "
        f"into {root} (torchvision checks every file against the official one's checksum)"
    )
{%- else %}
    names = ", ".join(Path(name).name for name, _ in DATASET.resources)
    # torchvision checks the files as downloaded against their checksums; unpacked, it reads
    # them as they are.
    raw = root / DATASET.__name__ / "raw"
    return f"{names} as downloaded, or unpacked (without .gz), into {raw}"
{%- endif %}


def decoded(dataset: datasets.VisionDataset) -> TensorImages:
    """The whole dataset as uint8 tensors (N, C, H, W), read once."""
    images = torch.as_tensor(dataset.data)
    images = images.unsqueeze(1) if images.ndim == 3 else images.permute(0, 3, 1, 2)
    return TensorImages(images.contiguous(), torch.as_tensor(dataset.targets))


class DataModule(InMemoryDataModule):
    """The official training set, split into train and val with a fixed seed, and test set."""

    # The contract's class members: the normalisation and a single image's preprocessing.
    mean, std = MEAN, STD
    prediction_transform = staticmethod(prediction_transform)

    def __init__(
        self,
        root: Path = Path("data"),
        batch_size: int = 128,
        num_workers: int | None = 0,
        val_fraction: float = 0.1,
        seed: int = 0,
        folds: int | None = None,
        fold: int = 0,
    ) -> None:
        super().__init__(batch_size, num_workers, val_fraction, seed, folds, fold)
        self.root = Path(root)
        self.class_names = CLASS_NAMES
        self.input_shape = INPUT_SHAPE
        self.normalise = eval_transform()

    def augment(self, images: Tensor) -> Tensor:
        """{{ spec.augment_doc }}"""
        return {{ spec.augment }}

    def prepare_data(self) -> None:
        # Runs on one process per node; downloads only what is missing.
        for train in (True, False):
            try:
                DATASET(self.root, train=train)
                continue
            except (OSError, RuntimeError, ValueError) as error:
                if "not found" not in str(error):  # the files are there, but unreadable
                    raise ConfigError(
                        f"{DATASET.__name__} in data.root {str(self.root)!r} is damaged "
                        f"({' '.join(str(error).split())}); delete its files to download them "
                        "again, or copy intact ones there"
                    ) from None
            try:
                DATASET(self.root, train=train, download=True)
            except (OSError, RuntimeError) as error:  # no network, a proxy, a full disk, ...
                raise ConfigError(
                    f"{DATASET.__name__} is not complete in data.root {str(self.root)!r} and "
                    f"could not be downloaded ({' '.join(str(error).split())}); check the "
                    f"network, or copy {files_it_reads(self.root)}"
                ) from None

    def setup(self, stage: str | None = None) -> None:
        train = decoded(DATASET(self.root, train=True))
        self.train_set, self.val_set = self.split(train, train)
        self.test_set = decoded(DATASET(self.root, train=False))
