"""scikit-learn's handwritten digits: 1,797 images of 8x8 pixels, shipped with the library."""

import torch
from torch import Tensor
from torch.utils.data import Subset
from torchvision.transforms import v2

from .batch_augment import random_crop
from .kit.datamodule import InMemoryDataModule, TensorImages
from .kit.errors import ConfigError

# Pixel values run from 0 to 16; mean and std of all digits, in those units.
MEAN, STD = (4.884,), (6.017,)


def eval_transform() -> v2.Transform:
    """Preprocessing for validation, test and prediction (one image or a batch): to float,
    normalised."""
    return v2.Compose([v2.ToDtype(torch.float32), v2.Normalize(MEAN, STD)])


def prediction_transform(input_shape: tuple[int, int, int]) -> v2.Transform:
    """An RGB image file -> model input, like the data: light digit on a dark background.

    The image is turned grey, resized to 8x8 and its 0..255 values scaled to the
    data's 0..16, then `eval_transform` applies.
    """
    return v2.Compose(
        [
            v2.Grayscale(),
            v2.Resize(input_shape[1:], antialias=True),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Lambda(lambda pixels: pixels * 16),
            eval_transform(),
        ]
    )


class DataModule(InMemoryDataModule):
    """Digits split into train, val and test with a fixed seed; one-pixel shifts as augmentation."""

    # The contract's class members: the normalisation and a single image's preprocessing.
    mean, std = MEAN, STD
    prediction_transform = staticmethod(prediction_transform)

    def __init__(
        self,
        batch_size: int = 64,
        num_workers: int | None = 0,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        seed: int = 0,
        folds: int | None = None,
        fold: int = 0,
    ) -> None:
        super().__init__(batch_size, num_workers, val_fraction, seed, folds, fold)
        if not 0 < test_fraction < 1 - val_fraction:
            raise ConfigError(
                f"data.test_fraction must be between 0 and {1 - val_fraction}, got {test_fraction}"
            )
        self.test_fraction = test_fraction
        self.class_names = tuple(str(digit) for digit in range(10))
        self.input_shape = (1, 8, 8)
        self.normalise = eval_transform()

    def augment(self, images: Tensor) -> Tensor:
        """One-pixel random shifts."""
        return random_crop(images, padding=1)

    def setup(self, stage: str | None = None) -> None:
        # Imported here: scikit-learn is slow to import and `train.py --help` never needs it.
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.from_numpy(digits.images).to(torch.uint8).unsqueeze(1)
        labels = torch.from_numpy(digits.target).long()
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.seed))
        n_test = round(len(order) * self.test_fraction)
        test, rest = order[:n_test], order[n_test:]
        rest_set = Subset(TensorImages(images, labels), rest.tolist())
        self.train_set, self.val_set = self.split(rest_set, rest_set)
        self.test_set = TensorImages(images[test], labels[test])
