"""The data module yields what the model expects: seeded split, train-only augmentation."""

import itertools
{%- if cookiecutter.dataset == "image_folder" %}
import shutil
{%- endif %}
from collections.abc import Callable, Sequence
{%- if cookiecutter.dataset == "image_folder" %}
from pathlib import Path
{%- endif %}

{% if cookiecutter.dataset == "image_folder" -%}
import fake_data
import numpy as np
{% endif -%}
import pytest
import torch
from lightning import Trainer
{%- if cookiecutter.dataset == "image_folder" %}
from PIL import Image
{%- endif %}
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset

from {{ cookiecutter.package_name }}.data import {% if cookiecutter.dataset == "image_folder" %}MEAN, STD, {% endif %}DataModule
from {{ cookiecutter.package_name }}.kit.datamodule import labels_of
from {{ cookiecutter.package_name }}.kit.errors import ConfigError


@pytest.fixture
def datamodule(make_datamodule: Callable[..., DataModule]) -> DataModule:
    dm = make_datamodule()
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_batches_have_the_shapes_and_dtypes_the_model_expects(datamodule: DataModule) -> None:
    for loader in (
        datamodule.train_dataloader(),
        datamodule.val_dataloader(),
        datamodule.test_dataloader(),
    ):
        x, y = datamodule.on_after_batch_transfer(next(iter(loader)), 0)
        assert x.dtype == torch.float32
        assert tuple(x.shape[1:]) == datamodule.input_shape
        assert y.dtype == torch.int64
        assert int(y.min()) >= 0 and int(y.max()) < datamodule.num_classes
    assert datamodule.num_classes == len(datamodule.class_names) >= 2


def test_inputs_are_normalised_floats_not_raw_pixels(datamodule: DataModule) -> None:
    x = torch.cat(
        [datamodule.on_after_batch_transfer(b, 0)[0] for b in datamodule.val_dataloader()]
    )
    # Normalisation subtracts the mean: raw or merely rescaled pixels are never negative.
    assert float(x.min()) < 0 < float(x.max())
    assert float(x.abs().max()) < 10


def test_split_is_seeded_and_disjoint(make_datamodule: Callable[..., DataModule]) -> None:
    def split(seed: int) -> tuple[list[int], list[int]]:
        dm = make_datamodule(seed=seed)
        dm.prepare_data()
        dm.setup("fit")
        return list(dm.train_set.indices), list(dm.val_set.indices)

    train, val = split(0)
    assert not set(train) & set(val)
    assert split(0) == (train, val)
    assert split(1)[1] != val


def folds_of(make_datamodule: Callable[..., DataModule], k: int, **options: object) -> list:
    """For each fold: the data module, the training indices and the held-out indices (into
    the pool of training samples that the folds share)."""
    found = []
    for fold in range(k):
        dm = make_datamodule(folds=k, fold=fold, **options)
        dm.prepare_data()
        dm.setup("fit")
        found.append((dm, set(dm.train_set.indices), set(dm.val_set.indices)))
    return found


def check_folds(folds: list) -> None:
    """Disjoint held-out folds that together cover the pool, each stratified by class."""
    pool_size = len(folds[0][0].val_set.dataset)
    labels = labels_of(folds[0][0].val_set.dataset)
    per_class = torch.bincount(labels)
    for _, train, held_out in folds:
        assert not train & held_out
        assert train | held_out == set(range(pool_size))
        in_fold = torch.bincount(labels[sorted(held_out)], minlength=len(per_class))
        # Each class in the same proportion in every fold, to within one sample.
        assert ((in_fold - per_class / len(folds)).abs() <= 1).all(), (in_fold, per_class)
    for (_, _, one), (_, _, other) in itertools.combinations(folds, 2):
        assert not one & other
    assert set().union(*(held_out for _, _, held_out in folds)) == set(range(pool_size))


def test_cross_validation_folds_are_disjoint_stratified_and_cover_the_training_data(
    make_datamodule: Callable[..., DataModule],
) -> None:
    folds = folds_of(make_datamodule, 3)
    check_folds(folds)
    # Seeded: the same seed gives the same folds, another seed others.
    assert [f[2] for f in folds_of(make_datamodule, 3)] == [f[2] for f in folds]
    assert folds_of(make_datamodule, 3, seed=1)[0][2] != folds[0][2]
{%- if cookiecutter.dataset == "image_folder" %}


def test_cross_validation_pools_train_and_val_folders(
    make_datamodule: Callable[..., DataModule], tmp_path: Path
) -> None:
    """With its own val folder, the folds are cut from train and val together."""
    root = tmp_path / "data"
    data_args = fake_data.write_dataset(root)
    shutil.copytree(root / "test", root / "val")
    size = int(data_args[data_args.index("--data.image_size") + 1])
    folds = folds_of(make_datamodule, 3, root=root, image_size=size)
    check_folds(folds)
    files = sum(1 for _ in (root / "train").rglob("*.png")) + sum(
        1 for _ in (root / "val").rglob("*.png")
    )
    assert len(folds[0][0].val_set.dataset) == files


def test_images_of_other_types_are_left_out_and_said(
    make_datamodule: Callable[..., DataModule], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "data"
    data_args = fake_data.write_dataset(root)
    size = int(data_args[data_args.index("--data.image_size") + 1])
    gif = next((root / "train").iterdir()) / "extra.gif"
    shutil.copy(next(gif.parent.glob("*.png")), gif)  # a PNG's bytes: Pillow reads it anyway
    (gif.parent / "notes.txt").write_text("not an image: not counted")
    datamodule = make_datamodule(root=root, image_size=size)
    datamodule.setup("fit")
    pngs = sum(1 for _ in (root / "train").rglob("*.png"))
    assert len(datamodule.train_set) + len(datamodule.val_set) == pngs  # the .gif left out
    assert f"{root}: 1 image file(s) left out, not .jpg" in caplog.text
    assert f"(such as {gif})" in caplog.text


def test_16_bit_grey_images_are_scaled_to_8_bits_not_clipped(
    make_datamodule: Callable[..., DataModule], tmp_path: Path
) -> None:
    """A 16-bit PNG (scans, microscopy) trains as it looks: scaled, not clipped."""
    root = tmp_path / "data"
    data_args = fake_data.write_dataset(root)
    size = int(data_args[data_args.index("--data.image_size") + 1])
    for path in root.rglob("*.png"):  # every image: mid-grey in 16 bits
        Image.fromarray(np.full((size, size), 32768, dtype=np.uint16)).save(path)
    assert Image.open(path).mode.startswith("I;16")
    datamodule = make_datamodule(root=root, image_size=size)
    datamodule.setup("fit")
    image, _ = datamodule.test_set[0]
    # Normalised: the pixels' value before it was 128 / 255 (Pillow's own conversion: 255).
    pixels = image * torch.tensor(STD).view(-1, 1, 1) + torch.tensor(MEAN).view(-1, 1, 1)
    assert torch.allclose(pixels, torch.full_like(pixels, 128 / 255), atol=1e-5)
{%- endif %}


def test_bad_fold_settings_are_refused(make_datamodule: Callable[..., DataModule]) -> None:
    with pytest.raises(ConfigError, match=r"data\.folds 1 with data\.fold 0"):
        make_datamodule(folds=1, fold=0)
    with pytest.raises(ConfigError, match=r"data\.folds 3 with data\.fold 3"):
        make_datamodule(folds=3, fold=3)


def model_input(dm: DataModule, dataset: Dataset, indices: Sequence[int], training: bool) -> Tensor:
    """The batch the model gets for these samples, in the training or the validation loop."""
    loader = DataLoader(Subset(dataset, indices), batch_size=len(indices), collate_fn=dm.collate_fn)
    dm.trainer = Trainer(accelerator="cpu", devices=1, logger=False)
    dm.trainer.training, dm.trainer.validating = training, not training
    return dm.on_after_batch_transfer(next(iter(loader)), 0)[0]


def test_augmentation_on_training_split_only(datamodule: DataModule) -> None:
    indices = datamodule.val_set.indices[:4]
    # The training and validation subsets view the same samples through different transforms.
    train, val = datamodule.train_set.dataset, datamodule.val_set.dataset
    augmented = [model_input(datamodule, train, indices, training=True) for _ in range(10)]
    plain = [model_input(datamodule, val, indices, training=False) for _ in range(3)]
    assert all(torch.equal(plain[0], p) for p in plain)
    assert any(not torch.equal(augmented[0], a) for a in augmented)


@pytest.mark.parametrize(
    ("key", "value"), [("batch_size", 0), ("val_fraction", 1.5), ("num_workers", -1)]
)
def test_bad_values_are_refused_by_name(
    make_datamodule: Callable[..., DataModule], key: str, value: float
) -> None:
    with pytest.raises(ConfigError, match=f"data.{key}"):
        make_datamodule(**{key: value})
