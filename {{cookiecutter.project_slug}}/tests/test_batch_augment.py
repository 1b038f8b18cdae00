{%- set reference = {
    "digits": "v2.RandomCrop(8, padding=1)",
    "mnist": "v2.RandomAffine(degrees=10, translate=(0.1, 0.1))",
    "fashion_mnist": "v2.Compose([v2.RandomCrop(28, padding=2), v2.RandomHorizontalFlip()])",
    "cifar10": "v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()])",
}.get(cookiecutter.dataset, "v2.Identity()") -%}
"""The in-memory data path (whole batches, processed on the device) against the classic
per-image path with torchvision transforms: same validation inputs, same augmentations in
distribution."""

from collections.abc import Callable

import pytest
import torch
from torch import Tensor
from torchvision.transforms import v2

from {{ cookiecutter.package_name }}.data import DataModule, eval_transform, prediction_transform
from {{ cookiecutter.package_name }}.kit.datamodule import TensorImages

# What the classic per-image pipeline would apply before eval_transform during training.
PER_IMAGE_AUGMENTATION = {{ reference }}
DRAWS = 4000


@pytest.fixture
def datamodule(make_datamodule: Callable[..., DataModule]) -> DataModule:
    """data.py's module, the default or not, holding random uint8 images of its input shape:
    these tests are about the batch path, not about reading the dataset's files."""
    dm = make_datamodule(DataModule)
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (64, *dm.input_shape), dtype=torch.uint8, generator=generator)
    labels = torch.randint(dm.num_classes, (64,), generator=generator)
    dm.train_set = dm.val_set = TensorImages(images, labels)
    return dm


def test_validation_batches_equal_images_preprocessed_one_by_one(datamodule: DataModule) -> None:
    batch = next(iter(datamodule.val_dataloader()))
    fast, labels = datamodule.on_after_batch_transfer(batch, 0)
    samples = [datamodule.val_set[i] for i in range(len(labels))]
    one_by_one = torch.stack([eval_transform()(image) for image, _ in samples])
    assert torch.equal(fast, one_by_one)
    assert torch.equal(labels, torch.stack([label for _, label in samples]))


def test_training_with_the_model_summary_runs(train: Callable[..., dict[str, float]]) -> None:
    # The summary sends the model's example input (no labels) through the batch hook.
    metrics = train("--max_epochs", "1", "--trainer.enable_model_summary", "true")
    assert 0 <= metrics["test/acc"] <= 1


def test_prediction_ends_with_the_validation_preprocessing(datamodule: DataModule) -> None:
    steps = prediction_transform(datamodule.input_shape).transforms
    assert repr(steps[-1]) == repr(eval_transform())


def pixel_statistics(images: Tensor) -> tuple[Tensor, Tensor]:
    images = images.float()
    return images.mean(dim=0), images.std(dim=0)


def test_batch_augmentation_matches_torchvision_in_distribution(datamodule: DataModule) -> None:
    torch.manual_seed(0)
    image, _ = datamodule.train_set[0]
    fast = datamodule.augment(image.expand(DRAWS, *image.shape))
    one_by_one = torch.stack([PER_IMAGE_AUGMENTATION(image) for _ in range(DRAWS)])
    assert fast.dtype == one_by_one.dtype == image.dtype
    assert fast.shape == one_by_one.shape
    # Per-pixel mean and spread over the draws: they differ by sampling noise only; a wrong
    # shift range, flip rate or angle moves them by far more.
    scale = float(image.float().std())
    for fast_stat, reference_stat in zip(
        pixel_statistics(fast), pixel_statistics(one_by_one), strict=True
    ):
        assert float((fast_stat - reference_stat).abs().mean()) < 0.025 * scale
    assert len(fast.unique(dim=0)) > 1
