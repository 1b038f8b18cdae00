"""Images as shards: convert the image folder once, then train by streaming the shards.

    python convert.py --root data --output shards          shards/{train,val,test}/, classes.json
    python train.py --data configs/data/shards.yaml        train from them (--data.input_dir)
    --data.input_dir s3://bucket/shards                    from object storage (AWS_* variables)

A folder of many small files is slow to list, check and read, and more so on a cluster's shared
file system; shards are few large files, read in order, each process and loader worker reading
its own share of them (LitData). Images stay encoded as they were (PNG, JPEG, ...) and go
through the same transforms as the folder's; prediction and export do not change.
"""

import argparse
import functools
import io
import json
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from litdata import StreamingDataLoader, StreamingDataset, optimize
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets

from .data import MEAN, STD, DataModule, eval_transform, prediction_transform, train_transform
from .datamodule import ImageDataModule, start_worker
from .errors import ConfigError

SPLITS = ("train", "val", "test")
# What a conversion writes beside its splits, last: a folder without it is not finished.
METADATA = "classes.json"


def encode(sample: list) -> dict[str, Any]:
    """One shard item: the image file's bytes as they are (still encoded), its label, and
    the file it came from, to name it (as bytes: LitData stores a text that names an image
    file as that file's pixels)."""
    path, label = sample
    return {"image": Path(path).read_bytes(), "label": label, "file": path.encode()}


def is_remote(location: str) -> bool:
    return location.startswith("s3://")


def read_file(location: str, name: str) -> bytes:
    """The file `name` under `location`: a folder or an s3:// URL (OSError if it is not there)."""
    if not is_remote(location):
        return (Path(location) / name).read_bytes()
    import boto3  # LitData's own S3 client: credentials and endpoint from the AWS_* variables
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, prefix = location.removeprefix("s3://").partition("/")
    try:
        key = f"{prefix.rstrip('/')}/{name}".lstrip("/")
        return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    except (BotoCoreError, ClientError) as error:
        raise OSError(str(error)) from None


def write_file(location: str, name: str, data: bytes) -> None:
    if is_remote(location):
        import boto3

        bucket, _, prefix = location.removeprefix("s3://").partition("/")
        key = f"{prefix.rstrip('/')}/{name}".lstrip("/")
        boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=data)
    else:
        (Path(location) / name).write_bytes(data)


def read_metadata(location: str) -> dict[str, Any]:
    """The classes.json of converted shards, local or in an S3 bucket."""
    try:
        return json.loads(read_file(location, METADATA))
    except (OSError, ValueError) as error:
        raise ConfigError(
            f"data.input_dir {location!r} holds no readable {METADATA} ({error}); convert an "
            f"image folder into it first: python convert.py --root data --output {location}"
        ) from None


def converted(location: str, split: str) -> int | None:
    """How many images a split's shards hold (None: the split was not converted to the end)."""
    try:
        index = json.loads(read_file(location, f"{split}/index.json"))
    except (OSError, ValueError):
        return None  # LitData writes index.json last
    return sum(chunk["chunk_size"] for chunk in index["chunks"])


def convert(
    root: Path,
    output: str,
    image_size: int = 64,
    val_fraction: float = 0.1,
    seed: int = 0,
    workers: int | None = None,
    chunk_bytes: str = "64MB",
) -> dict[str, Any]:
    """Convert root/{train,val,test} into shards under `output`; return what classes.json holds.

    The splits are the folder data module's own (its val folder, or the same seeded share of
    train; without a test folder the validation images test), and every image is checked
    first, as training from the folder would. A split converted to the end is kept; an
    interrupted one continues from LitData's checkpoints.
    """
    folder = DataModule(root=root, image_size=image_size, val_fraction=val_fraction, seed=seed)
    folder.setup("fit")
    samples = {
        # Lists, not tuples: LitData compares them with their JSON copy to resume.
        split: [[str(path), int(label)] for path, label in samples_of(dataset)]
        for split, dataset in (
            ("train", folder.train_set),
            ("val", folder.val_set),
            ("test", folder.test_set),
        )
    }
    if not is_remote(output):
        Path(output).mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        if not is_remote(output) and converted(output, split) == len(samples[split]):
            print(f"{split}: converted already ({output}/{split})")
            continue
        print(f"{split}: {len(samples[split])} images -> {output}/{split}")
        optimize(
            fn=encode,
            inputs=samples[split],
            output_dir=f"{output}/{split}",
            chunk_bytes=chunk_bytes,
            num_workers=workers or os.cpu_count() or 1,
            use_checkpoint=True,
            reorder_files=False,  # keep the order: shard k holds a contiguous run of files
            mode="overwrite" if is_remote(output) else None,
        )
        # LitData finishes a split whose worker was killed as if it were whole: say so, and
        # leave the split unfinished, so that running the command again goes on with it.
        if (done := converted(output, split)) != len(samples[split]):
            if not is_remote(output):
                (Path(output) / split / "index.json").unlink(missing_ok=True)
            raise ConfigError(
                f"converting {split} stopped after {done or 0} of {len(samples[split])} images "
                "(a worker process ended early); run the same command again to go on"
            )
    metadata = {
        "class_names": list(folder.class_names),
        "input_shape": list(folder.input_shape),
        "samples": {split: len(samples[split]) for split in SPLITS},
        "source": str(root),
    }
    write_file(output, METADATA, json.dumps(metadata, indent=2).encode())
    return metadata


def samples_of(dataset: Dataset) -> list[tuple[str, int]]:
    """(file, label) of every sample of an ImageFolder, or of a subset or concatenation of them."""
    from torch.utils.data import ConcatDataset, Subset

    if isinstance(dataset, Subset):
        inner = samples_of(dataset.dataset)
        return [inner[i] for i in dataset.indices]
    if isinstance(dataset, ConcatDataset):
        return [s for part in dataset.datasets for s in samples_of(part)]
    assert isinstance(dataset, datasets.ImageFolder)
    return list(dataset.samples)


class ImageShards(StreamingDataset):
    """Shard items as (image, label): the stored file decoded to RGB, then `image_transform`."""

    def __init__(self, input_dir: str, image_transform: Callable, **options: Any) -> None:
        super().__init__(input_dir, **options)
        self.image_transform = image_transform

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, int]:
        item = super().__getitem__(index)
        # As ImageFolder reads a file: every image as RGB.
        with Image.open(io.BytesIO(item["image"])) as image:
            return self.image_transform(image.convert("RGB")), item["label"]


class ShardsLoader(StreamingDataLoader):
    """LitData's loader, ending a resumed epoch where Lightning ends it.

    After `load_state_dict` the loader replays the interrupted epoch's order, and clears that
    only when the epoch runs into StopIteration. Lightning ends an epoch at the loader's length
    without asking for one more batch, so the next epoch would replay the resumed one again;
    here the next epoch starts as a new one.
    """

    resumed_epoch_started = False

    def __iter__(self) -> Any:
        if self.restore and self.resumed_epoch_started:
            self.restore = False  # the resumed epoch was served: this is the next one
        self.resumed_epoch_started = self.restore
        return super().__iter__()


class ShardsDataModule(ImageDataModule):
    """The converted image folder, streamed from `input_dir` (a folder, or an s3:// URL).

    Under DDP each process reads its own part of every epoch, and each loader worker its own
    part of that, every image once (LitData drops the last few of an epoch so that every
    process gets the same number of batches). The loader's position is in every checkpoint:
    a run killed mid-epoch resumes where it stopped.
    """

    mean, std = MEAN, STD
    prediction_transform = staticmethod(prediction_transform)

    def __init__(
        self,
        input_dir: str = "shards",
        image_size: int | None = None,
        batch_size: int = 32,
        num_workers: int | None = None,
        seed: int = 0,
        cache_dir: Path | None = None,
        max_cache_size: str = "50GB",
    ) -> None:
        super().__init__(batch_size, num_workers, val_fraction=0.1, seed=seed)
        self.input_dir = str(input_dir).rstrip("/")
        metadata = read_metadata(self.input_dir)
        self.class_names = tuple(metadata["class_names"])
        size = image_size or metadata["input_shape"][-1]
        self.image_size = size
        self.input_shape = (3, size, size)
        # Remote shards are downloaded into the cache as they are read, and the oldest read
        # are removed again beyond max_cache_size.
        self.cache_dir = str(cache_dir) if cache_dir is not None else None
        self.max_cache_size = max_cache_size

    def setup(self, stage: str | None = None) -> None:
        evaluation = eval_transform(self.image_size)
        self.train_set = self._shards("train", train_transform(self.image_size), shuffle=True)
        self.val_set = self._shards("val", evaluation)
        self.test_set = self._shards("test", evaluation)

    def _shards(self, split: str, transform: Callable, shuffle: bool = False) -> ImageShards:
        return ImageShards(
            f"{self.input_dir}/{split}",
            transform,
            shuffle=shuffle,
            # LitData's default: with several processes, drop an epoch's last few images so
            # that all step together (DDP's collectives wait for each other, in validation too);
            # a single process sees every image.
            drop_last=None,
            seed=self.loader_seed(),
            cache_dir=None if self.cache_dir is None else f"{self.cache_dir}/{split}",
            max_cache_size=self.max_cache_size,
        )

    def make_loader(self, dataset: Dataset | None, shuffle: bool = False) -> DataLoader:
        if dataset is None:
            raise RuntimeError("call setup() before asking for a data loader")
        on_gpu = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        # Lightning warns that an iterable dataset's length can be wrong with several workers;
        # LitData gives each worker its own shards, so the length is exact.
        warnings.filterwarnings("ignore", message="Your `IterableDataset` has `__len__` defined")
        # The dataset shuffles (by shard, then within a window) and shares out the shards;
        # the loader's state holds the position for an exact resume.
        return ShardsLoader(
            dataset,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            pin_memory=on_gpu,
            # Its own generator: starting an epoch's workers never draws from the global RNG
            # that dropout uses (a resumed run starts its loaders at other moments).
            generator=torch.Generator().manual_seed(self.loader_seed() + 1),
            multiprocessing_context=self.worker_server() if self.num_workers > 0 else None,
            worker_init_fn=functools.partial(start_worker, main_process=os.getpid()),
        )

    def restore_loader(
        self, loader: DataLoader, state: dict[str, Any], epoch_finished: bool
    ) -> None:
        if epoch_finished:
            # The next epoch starts afresh: only the count of epochs (each its own order) goes on.
            loader.current_epoch = state["current_epoch"]
        else:
            loader.load_state_dict(state)  # the rest of the interrupted epoch, then on as before


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Convert an image folder (train/, val/, test/; one sub-folder per class) "
        "into shards that train.py streams with --data configs/data/shards.yaml."
    )
    parser.add_argument("--root", type=Path, default=Path("data"), help="the image folder")
    parser.add_argument("--output", default="shards", help="a folder, or s3://bucket/prefix")
    parser.add_argument("--image_size", type=int, default=64, help="the model's input size")
    parser.add_argument("--val_fraction", type=float, default=0.1, help="without a val folder")
    parser.add_argument("--seed", type=int, default=0, help="of the validation share")
    parser.add_argument("--workers", type=int, default=None, help="default: every CPU")
    parser.add_argument("--chunk_bytes", default="64MB", help="the size of one shard")
    args = parser.parse_args(argv)
    try:
        metadata = convert(
            args.root, args.output, args.image_size, args.val_fraction, args.seed,
            args.workers, args.chunk_bytes,
        )  # fmt: skip
    except ConfigError as error:
        raise SystemExit(f"error: {error}") from None
    counts = ", ".join(f"{n} {split}" for split, n in metadata["samples"].items())
    print(f"Shards: {args.output} ({counts} images, {len(metadata['class_names'])} classes)")
    print(f"Train:  python train.py --data configs/data/shards.yaml --data.input_dir {args.output}")
