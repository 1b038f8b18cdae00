"""Your own images: one sub-folder per class under root/train (and optionally root/val, root/test).

    root/train/cat/0001.jpg    root/val/cat/...    root/test/cat/...
    root/train/dog/0002.png    root/val/dog/...    root/test/dog/...

Without root/val, a seeded fraction of root/train is held out for validation;
without root/test, the validation images are used for testing. With data.folds, the
validation images are a fold of root/train and root/val together (cross-validation).
"""

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from PIL import Image
from torch.utils.data import ConcatDataset
from torchvision import datasets
from torchvision.datasets.folder import IMG_EXTENSIONS
from torchvision.transforms import v2

from .image_files import open_rgb
from .kit.datamodule import ImageDataModule
from .kit.errors import ConfigError

# ImageNet statistics: right for photographs and for pretrained backbones.
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def eval_transform(image_size: int = 64) -> v2.Transform:
    """Preprocessing for validation, test and prediction: resize, centre crop, normalise."""
    return v2.Compose(
        [
            v2.ToImage(),
            v2.Resize(image_size, antialias=True),
            v2.CenterCrop(image_size),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )


def train_transform(image_size: int = 64) -> v2.Transform:
    """An image -> augmented training input: random crops and flips.

    Change it to change the augmentation (training only; `eval_transform` serves validation,
    test and prediction). The folder and its shards (shards.py) both train with it.
    """
    return v2.Compose(
        [
            v2.ToImage(),
            v2.RandomResizedCrop(image_size, scale=(0.6, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )


def prediction_transform(input_shape: tuple[int, int, int]) -> v2.Transform:
    """An RGB image (a file as `open_rgb` reads it) -> model input: `eval_transform`."""
    return eval_transform(input_shape[-1])


def class_folders(folder: Path) -> list[str]:
    """Names of the sub-folders of `folder`, sorted as ImageFolder sorts them."""
    return sorted(entry.name for entry in folder.iterdir() if entry.is_dir())


def image_files(folder: Path) -> list[Path]:
    """The files under `folder` that ImageFolder reads (by extension)."""
    files = (path for path in folder.rglob("*") if path.is_file())
    return sorted(path for path in files if path.suffix.lower() in IMG_EXTENSIONS)


def split_files(split: Path) -> list[Path]:
    """The image files of a split; a class folder without any is refused, naming it."""
    files = []
    for name in class_folders(split):
        found = image_files(split / name)
        if not found:
            raise ConfigError(
                f"{split / name} holds no image files ({', '.join(IMG_EXTENSIONS)}); "
                "every class folder needs at least one"
            )
        files += found
    return files


def check_images(files: Iterable[Path]) -> None:
    """Every image opens and passes Pillow's verify (a damaged or truncated header, a file that
    is no image); otherwise name the first that does not."""
    for path in files:
        try:
            with Image.open(path) as image:
                image.verify()
        except (OSError, SyntaxError) as error:
            raise ConfigError(
                f"{path} is not a readable image ({error}); remove or replace it"
            ) from None


def check_once(root: Path, splits: Iterable[str]) -> None:
    """Check every image of the splits once, and again only when a file changes.

    Opening tens of thousands of files takes seconds to minutes before the first step, in
    every process that starts; a passed check is remembered in the user's cache, keyed by
    every file's name, size and modification time (listing them is cheap). Only the first
    process of a run checks: Lightning's launcher starts the others after it, and under
    torchrun or SLURM they wait for it in the process group, which a bad file ends on one line.
    """
    files = [file for split in splits for file in split_files(root / split)]
    if rank_zero_only.rank != 0:
        return
    # Images Pillow reads that ImageFolder does not list (a .gif, say): said, not skipped quietly.
    readable = Image.registered_extensions()
    others = [
        path
        for split in splits
        for path in (root / split).rglob("*")
        if path.suffix.lower() in readable and path.suffix.lower() not in IMG_EXTENSIONS
    ]
    if others:
        rank_zero_info(
            f"{root}: {len(others)} image file(s) left out, not {', '.join(IMG_EXTENSIONS)} "
            f"(such as {others[0]})"
        )
    listing = hashlib.sha256()
    for file in files:
        stat = file.stat()
        listing.update(f"{file}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / __package__
    folder_key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    record = cache / "checked-images" / f"{folder_key}.json"
    try:
        if json.loads(record.read_text())["files"] == listing.hexdigest():
            return
    except (OSError, ValueError, KeyError):
        pass  # never checked, or the record is unreadable: check
    check_images(files)
    partial = record.with_suffix(f".{os.getpid()}")
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps({"root": str(root.resolve()), "files": listing.hexdigest()}))
        partial.replace(record)  # whole or not at all: a reader never sees half a record
    except OSError:
        partial.unlink(missing_ok=True)  # a read-only or full disk: the check runs next time


class DataModule(ImageDataModule):
    """ImageFolder datasets read from `root`; images are converted to RGB of `image_size`."""

    # The contract's class members: the normalisation and a single image's preprocessing.
    mean, std = MEAN, STD
    prediction_transform = staticmethod(prediction_transform)

    def __init__(
        self,
        root: Path = Path("data"),
        image_size: int = 64,
        batch_size: int = 32,
        num_workers: int | None = None,
        val_fraction: float = 0.1,
        seed: int = 0,
        folds: int | None = None,
        fold: int = 0,
    ) -> None:
        super().__init__(batch_size, num_workers, val_fraction, seed, folds, fold)
        if image_size < 1:
            raise ConfigError(f"data.image_size must be a positive integer, got {image_size}")
        self.root = Path(root)
        self.image_size = image_size
        train = self.root / "train"
        if not self.root.is_dir():
            raise ConfigError(
                f"data.root {str(self.root)!r} does not exist; expected "
                f"{self.root}/train/<class name>/<image files>"
            )
        if not train.is_dir():
            raise ConfigError(
                f"data.root {str(self.root)!r} has no 'train' folder; expected "
                f"{self.root}/train/<class name>/<image files>"
            )
        self.class_names = tuple(class_folders(train))
        if len(self.class_names) < 2:
            raise ConfigError(
                f"data.root {str(train)!r} holds {len(self.class_names)} class folder(s); "
                f"a classifier needs at least 2"
            )
        for split in ("val", "test"):
            folder = self.root / split
            if folder.is_dir() and class_folders(folder) != list(self.class_names):
                raise ConfigError(
                    f"{folder} has classes {class_folders(folder)}, but train has "
                    f"{list(self.class_names)}; every split needs the same class folders"
                )
        # A bad image is named now, before a run folder exists.
        check_once(self.root, [s for s in ("train", "val", "test") if (self.root / s).is_dir()])
        self.input_shape = (3, image_size, image_size)

    def train_transform(self) -> v2.Transform:
        """An image file -> augmented training input (`train_transform` above)."""
        return train_transform(self.image_size)

    def setup(self, stage: str | None = None) -> None:
        train, val = self.root / "train", self.root / "val"
        evaluation = eval_transform(self.image_size)
        if val.is_dir() and self.folds is None:
            self.train_set = self._folder(train, self.train_transform())
            self.val_set = self._folder(val, evaluation)
        else:
            # Cross-validation folds are cut from train and val together.
            parts = [train, val] if val.is_dir() else [train]
            self.train_set, self.val_set = self.split(
                ConcatDataset([self._folder(part, self.train_transform()) for part in parts]),
                ConcatDataset([self._folder(part, evaluation) for part in parts]),
            )
        test = self.root / "test"
        self.test_set = self._folder(test, evaluation) if test.is_dir() else self.val_set

    @staticmethod
    def _folder(path: Path, transform: v2.Transform) -> datasets.ImageFolder:
        return datasets.ImageFolder(path, transform=transform, loader=open_rgb)
