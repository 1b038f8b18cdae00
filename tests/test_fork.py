"""A fork, edited as its user would: images listed in a CSV file become the default data, a
network of the user's own the default network with the penalty on its classifier, and a new
metric is logged and monitored. The project's own tests (`pytest -m ""`) then pass with one test
file rewritten: tests/fake_data.py, the test data of the default dataset, which was replaced.
data.py stays and its tests still pass (test_batch_augment.py, on images of its own)."""

import re
import sys
from pathlib import Path

import pytest

from helpers import CASES, Render, render, run

# A data module of the contract (kit/datamodule.py's ImageDataModule): path,label lines.
LISTED = '''"""Images listed in a CSV file: `path,label` lines, paths relative to the file."""

import csv
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision.transforms import v2

from .kit.datamodule import ImageDataModule
from .kit.errors import ConfigError

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def preprocess(size: int, augment: bool = False) -> v2.Transform:
    """An RGB image -> model input; random crops and flips when augmenting."""
    resize = v2.RandomResizedCrop(size, scale=(0.7, 1.0)) if augment else v2.Resize((size, size))
    flips = [v2.RandomHorizontalFlip()] if augment else []
    normalise = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    return v2.Compose([v2.ToImage(), resize, *flips, *normalise])


class Listed(Dataset):
    def __init__(self, files: list[Path], labels: list[int], transform: v2.Transform) -> None:
        self.files, self.labels, self.transform = files, labels, transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.files[index]) as image:
            return self.transform(image.convert("RGB")), self.labels[index]


class CsvImages(ImageDataModule):
    mean, std = MEAN, STD

    @staticmethod
    def prediction_transform(input_shape: tuple[int, int, int]) -> v2.Transform:
        return preprocess(input_shape[-1])

    def __init__(
        self, csv_file: Path = Path("data/labels.csv"), image_size: int = 32,
        batch_size: int = 32, num_workers: int | None = None, val_fraction: float = 0.2,
        seed: int = 0, folds: int | None = None, fold: int = 0,
    ) -> None:
        super().__init__(batch_size, num_workers, val_fraction, seed, folds, fold)
        self.csv_file = Path(csv_file)
        if not self.csv_file.is_file():
            raise ConfigError(f"data.csv_file {str(self.csv_file)!r} is not a file")
        with self.csv_file.open(newline="") as lines:
            rows = [(self.csv_file.parent / path, label) for path, label in csv.reader(lines)]
        self.class_names = tuple(sorted({label for _, label in rows}))
        self.files = [path for path, _ in rows]
        self.labels = [self.class_names.index(label) for _, label in rows]
        self.input_shape = (3, image_size, image_size)

    def setup(self, stage: str | None = None) -> None:
        size = self.input_shape[-1]
        train = Listed(self.files, self.labels, preprocess(size, augment=True))
        evaluation = Listed(self.files, self.labels, preprocess(size))
        self.train_set, self.val_set = self.split(train, evaluation)
        self.test_set = self.val_set
'''

# A network of the user's own, its classifier a layer that carries the L2 penalty.
WIDE = '''"""A wide, shallow network: one convolution stage, then the classifier."""

from torch import Tensor, nn

from .backbones import L2Linear


class WideNet(nn.Module):
    def __init__(
        self, in_channels: int, num_classes: int, width: int = 48, head_penalty: float = 0.0
    ) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 5, padding=2), nn.BatchNorm2d(width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = L2Linear(width, num_classes, head_penalty)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))
'''

# The test data of the new default dataset, in its own format: PNG files and a CSV file.
FAKE_DATA = '''"""Test data: small PNG images listed in a CSV file, like data/labels.csv."""

import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

PROJECT = Path(__file__).resolve().parents[1]
CLASSES = ("cat", "dog", "fox")


def write_dataset(root: Path) -> list[str]:
    """Write root/labels.csv and its images; return the data arguments that select them."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    lines = []
    for index in range(60):
        label = index % len(CLASSES)
        pixels = rng.integers(0, 128, (20, 20, 3), dtype=np.uint8)
        pixels[..., label] += 100  # each class leans to one colour: learnable
        Image.fromarray(pixels).save(root / "images" / f"{index}.png")
        lines.append(f"images/{index}.png,{CLASSES[label]}")
    (root / "labels.csv").write_text("\\n".join(lines) + "\\n")
    return ["--data.csv_file", str(root / "labels.csv")]


@pytest.fixture(scope="session")
def data_args(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_dataset(tmp_path_factory.mktemp("listed"))


@pytest.fixture
def train_command() -> list[str]:
    return [sys.executable, str(PROJECT / "train.py")]


@pytest.fixture
def bad_data() -> dict:
    return {"no such file": (["--data.csv_file", "nowhere.csv"], "data.csv_file")}
'''


def replace_block(text: str, header: str, block: str) -> str:
    """Replace the YAML block that starts at the line matching `header` (up to the next line
    indented as little or less) with `block`."""
    lines = text.splitlines(keepends=True)
    (start,) = [i for i, line in enumerate(lines) if re.match(header, line)]
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and len(lines[end]) - len(lines[end].lstrip()) > indent:
        end += 1
    return "".join(lines[:start]) + block + "".join(lines[end:])


def fork(rendered: Render) -> None:
    """The four edits, as files and lines of the project."""
    package, name = rendered.package, rendered.answers["package_name"]
    (package / "listed.py").write_text(LISTED)
    (package / "wide_net.py").write_text(WIDE)
    model = package / "model.py"
    source = model.read_text()
    metric = '"f1": MulticlassF1Score(num_classes, average="macro"),\n'
    assert metric in source
    indent = source.split(metric)[0].rsplit("\n", 1)[1]
    source = source.replace(
        metric,
        metric + f'{indent}"precision": MulticlassPrecision(num_classes, average="macro"),\n',
    )
    source = source.replace("MulticlassF1Score\n", "MulticlassF1Score, MulticlassPrecision\n")
    model.write_text(source)
    config = rendered.path / "configs" / "default.yaml"
    text = config.read_text()
    text = replace_block(
        text,
        r"data:",
        "data:  # images listed in a CSV file\n"
        f"  class_path: {name}.listed.CsvImages  # listed.py\n"
        "  init_args:\n"
        "    csv_file: data/labels.csv  # path,label lines, paths relative to the file\n"
        "    image_size: 32  # images are resized to this many pixels a side\n"
        "    batch_size: 32  # images per batch and process\n"
        "    num_workers: 0  # loader processes\n"
        "    val_fraction: 0.2  # share held out for validation and test\n"
        "    seed: 0  # seed of the split\n"
        "    folds: null  # K: validation is fold `fold` of K\n"
        "    fold: 0  # which fold is held out\n",
    )
    text = replace_block(
        text,
        r"  backbone:",
        "  backbone:  # the network\n"
        f"    class_path: {name}.wide_net.WideNet  # wide_net.py\n"
        "    init_args:\n"
        "      width: 48  # channels of the convolution\n"
        "      head_penalty: 0.001  # L2 penalty on the classifier's weight\n",
    )
    text, count = re.subn(r"(?m)^monitor: val/loss", "monitor: val/precision", text)
    assert count == 1
    config.write_text(text)
    (rendered.path / "tests" / "fake_data.py").write_text(FAKE_DATA)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["default", "mnist"])  # digits, TensorBoard; torchvision, MLflow
def test_a_forked_project_passes_its_own_tests(tmp_path: Path, case: str) -> None:
    rendered = render(tmp_path, **CASES[case])
    fork(rendered)
    tests = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", ""],
        cwd=rendered.path,
        timeout=1800,
        PYTHONPATH=str(rendered.path / "src"),
    )
    assert tests.returncode == 0, tests.stdout[-8000:]
    # The edits took: the defaults the project's whole runs trained with are the fork's.
    shown = run(
        [sys.executable, "train.py", "--print_config"],
        cwd=rendered.path,
        PYTHONPATH=str(rendered.path / "src"),
    )
    assert shown.returncode == 0, shown.stdout
    for line in ("listed.CsvImages", "wide_net.WideNet", "head_penalty: 0.001", "val/precision"):
        assert line in shown.stdout, shown.stdout
