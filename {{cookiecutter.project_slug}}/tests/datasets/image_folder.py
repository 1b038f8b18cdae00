"""Test data: a tiny image folder (train/ and test/, one sub-folder per class) of PNG files."""

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

PROJECT = Path(__file__).resolve().parents[1]
CLASSES = ("cat", "dog", "fox")


def write_dataset(root: Path) -> list[str]:
    """Write root/{train,test}/<class>/*.png; return the data arguments that select it."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 24), ("test", 6)):
        for label, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
                pixels[..., label] = 255  # each class has its own dominant colour
                image = Image.fromarray(pixels)
                # A few greyscale files: the loader converts every image to RGB.
                (image.convert("L") if i % 5 == 0 else image).save(folder / f"{i}.png")
    return ["--data.root", str(root), "--data.image_size", "16"]


@pytest.fixture(scope="session")
def data_args(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """CLI arguments that select the tiny test dataset (written once per session)."""
    return write_dataset(tmp_path_factory.mktemp("data"))


@pytest.fixture
def train_command() -> list[str]:
    """The command that runs train.py in a subprocess."""
    return [sys.executable, str(PROJECT / "train.py")]


@pytest.fixture
def bad_data(tmp_path: Path) -> dict:
    """Data arguments that must be refused: name -> (arguments, part of the message)."""
    one_class, empty_class, corrupt, missing = (tmp_path / n for n in ("1", "0", "bad", "mis"))
    write_dataset(one_class)
    for name in CLASSES[1:]:
        shutil.rmtree(one_class / "train" / name)
    write_dataset(empty_class)
    for image in (empty_class / "train" / "dog").iterdir():
        image.unlink()
    write_dataset(corrupt)
    (corrupt / "train" / "fox" / "3.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    write_dataset(missing)
    shutil.copytree(missing / "test", missing / "val")
    shutil.rmtree(missing / "val" / "fox")
    return {
        "root that does not exist": (["--data.root", str(tmp_path / "nowhere")], "does not exist"),
        "a single class": (["--data.root", str(one_class)], "needs at least 2"),
        "a class folder without images": (["--data.root", str(empty_class)], "dog holds no image"),
        "a corrupt image": (["--data.root", str(corrupt)], "fox/3.png is not a readable image"),
        "a class missing from val": (["--data.root", str(missing)], "every split needs the same"),
        "images of no size": (
            [*write_dataset(tmp_path / "good")[:2], "--data.image_size", "0"],
            "data.image_size must be a positive integer, got 0",
        ),
    }
