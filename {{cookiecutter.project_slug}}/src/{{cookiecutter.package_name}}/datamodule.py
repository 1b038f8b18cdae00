"""What every data module here shares: seeded splits and well-configured loaders.

The dataset itself (where images come from, their transforms) lives in data.py.
"""

import os
from collections.abc import Sequence

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Subset


class ConfigError(ValueError):
    """Bad input from the user (a path, a value); the CLI prints it on one line."""


class ImageDataModule(L.LightningDataModule):
    """Train/val/test loaders over datasets that `setup` of a subclass assigns.

    Subclasses set `class_names` and `input_shape` (C, H, W) in `__init__`, so
    the model can be built from them before any data is read.
    """

    class_names: Sequence[str]
    input_shape: tuple[int, int, int]

    def __init__(
        self, batch_size: int, num_workers: int | None, val_fraction: float, seed: int
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ConfigError(f"data.batch_size must be a positive integer, got {batch_size}")
        if not 0 < val_fraction < 1:
            raise ConfigError(f"data.val_fraction must be between 0 and 1, got {val_fraction}")
        if num_workers is not None and num_workers < 0:
            raise ConfigError(f"data.num_workers must be 0 or more, got {num_workers}")
        self.batch_size = batch_size
        self.num_workers = default_num_workers() if num_workers is None else num_workers
        self.val_fraction = val_fraction
        self.seed = seed
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def state_dict(self) -> dict[str, list[str]]:
        # Lightning stores this in every checkpoint: predict and export name classes without data.
        return {"class_names": list(self.class_names)}

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set)

    def split(self, train: Dataset, evaluation: Dataset) -> tuple[Subset, Subset]:
        """Seeded train/val split of one dataset seen through two transforms.

        `train` and `evaluation` hold the same samples; only the training part
        gets augmentation.
        """
        generator = torch.Generator().manual_seed(self.seed)
        order = torch.randperm(len(train), generator=generator).tolist()
        n_val = max(1, round(len(order) * self.val_fraction))
        return Subset(train, order[n_val:]), Subset(evaluation, order[:n_val])

    def _loader(self, dataset: Dataset | None, shuffle: bool = False) -> DataLoader:
        if dataset is None:
            raise RuntimeError("call setup() before asking for a data loader")
        on_gpu = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            pin_memory=on_gpu,
            persistent_workers=self.num_workers > 0,
        )


def default_num_workers() -> int:
    """Half of the CPUs this process may use (at least 1, at most 8)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(8, (cpus or 2) // 2))
