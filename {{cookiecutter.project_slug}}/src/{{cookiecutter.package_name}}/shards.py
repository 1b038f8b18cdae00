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
import hashlib
import io
import json
import shlex
import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from litdata import StreamingDataLoader, StreamingDataset, optimize
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset
from torchvision import datasets

from .data import (
    MEAN,
    STD,
    DataModule,
    eval_transform,
    prediction_transform,
    train_transform,
)
from .image_files import open_rgb
from .kit.datamodule import ImageDataModule, usable_cpus
from .kit.errors import ConfigError
from .kit.workers import file_sample as encode  # what the conversion's workers run

SPLITS = ("train", "val", "test")
# Written last: shards without it are not a finished conversion.
METADATA = "classes.json"
# Which images each finished split holds, so that a changed folder is converted again.
CONVERTED = "converted.json"
IMAGES_PER_WORKER = 1000


def location_of(location: str, name: str) -> str:
    """A folder, or an s3:// URL (the only remote store supported), without a trailing slash."""
    location = str(location).rstrip("/")
    if "://" in location and not is_remote(location):
        raise ConfigError(f"{name} {location!r}: a folder or an s3://bucket/prefix URL")
    return location


def is_remote(location: str) -> bool:
    return location.startswith("s3://")


def s3_key(location: str, name: str) -> tuple[str, str]:
    bucket, _, prefix = location.removeprefix("s3://").partition("/")
    return bucket, f"{prefix.rstrip('/')}/{name}".lstrip("/")


def read_file(location: str, name: str) -> bytes:
    """The file `name` under `location`; FileNotFoundError if it is not there."""
    if not is_remote(location):
        return (Path(location) / name).read_bytes()
    import boto3  # LitData's own S3 client: credentials and endpoint from the AWS_* variables
    from botocore.exceptions import ClientError

    bucket, key = s3_key(location, name)
    try:
        return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
            raise FileNotFoundError(f"{location}/{name}") from None
        raise


def write_file(location: str, name: str, data: bytes | None) -> None:
    """Write the file `name` under `location`; None removes it."""
    if is_remote(location):
        import boto3

        bucket, key = s3_key(location, name)
        client = boto3.client("s3")
        if data is None:
            client.delete_object(Bucket=bucket, Key=key)
        else:
            client.put_object(Bucket=bucket, Key=key, Body=data)
    elif data is None:
        (Path(location) / name).unlink(missing_ok=True)
    else:
        (Path(location) / name).write_bytes(data)


def read_metadata(location: str) -> dict[str, Any]:
    """The classes.json of converted shards, local or in an S3 bucket."""
    try:
        return json.loads(read_file(location, METADATA))
    except FileNotFoundError:
        raise ConfigError(
            f"data.input_dir {location!r} holds no finished conversion ({METADATA} is missing); "
            f"convert the image folder into it: python convert.py --root data --output {location}"
        ) from None
    except Exception as error:  # the store's own errors: credentials, endpoint, permissions
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(
            f"could not read {location}/{METADATA} ({message}); check the path, or for s3:// "
            "the AWS_* variables (credentials, AWS_ENDPOINT_URL)"
        ) from None


def converted(location: str, split: str) -> int | None:
    """How many images a split's shards hold (None: the split was not converted to the end)."""
    try:
        index = json.loads(read_file(location, f"{split}/index.json"))
    except (FileNotFoundError, ValueError):
        return None  # LitData writes index.json last
    return sum(chunk["chunk_size"] for chunk in index["chunks"])


def fingerprint(samples: list[list]) -> str:
    """Which images, with which labels, each file's size and modification time included."""
    digest = hashlib.sha256()
    for path, label in samples:
        stat = Path(path).stat()
        digest.update(f"{path}\0{label}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def default_workers(items: int) -> int:
    """A process per IMAGES_PER_WORKER images, at most every CPU this process may use: each
    process LitData starts costs a second or two before it converts anything."""
    return max(1, min(usable_cpus() or 1, items // IMAGES_PER_WORKER))


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
    first, as training from the folder would. A split converted to the end from the same
    images is kept; an interrupted one goes on from LitData's checkpoints; one converted
    from other images (the folder changed, another --seed) is converted again.
    """
    output = location_of(output, "--output")
    try:
        folder = DataModule(
            root=Path(root).resolve(), image_size=image_size, val_fraction=val_fraction, seed=seed
        )
    except ConfigError as error:  # named as the folder module's options: say this command's
        message = str(error)
        for option in ("root", "val_fraction", "image_size"):
            message = message.replace(f"data.{option}", f"--{option}")
        raise ConfigError(message) from None
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
    try:
        done = json.loads(read_file(output, CONVERTED))
    except (FileNotFoundError, ValueError):
        done = {}
    write_file(output, METADATA, None)  # until every split is converted again
    for split in SPLITS:
        wanted = {"images": len(samples[split]), "fingerprint": fingerprint(samples[split])}
        finished = converted(output, split)
        if finished == wanted["images"] and done.get(split) == wanted:
            print(f"{split}: converted already ({output}/{split})")
            continue
        print(f"{split}: {len(samples[split])} images -> {output}/{split}")
        # Other images than a finished or a stopped conversion held: start the split afresh.
        afresh = finished is not None or done.get(split, wanted) != wanted
        done.pop(split, None)
        write_file(output, CONVERTED, json.dumps(done, indent=2).encode())
        processes = workers or default_workers(len(samples[split]))
        try:
            shard(samples[split], f"{output}/{split}", processes, chunk_bytes, afresh)
        except ValueError as error:
            if "checkpoint" not in str(error):
                raise
            # A stopped conversion of other images, or with another number of workers.
            shard(samples[split], f"{output}/{split}", processes, chunk_bytes, afresh=True)
        # LitData ends a split whose worker was killed as if it were whole: say so, and leave
        # the split unfinished.
        if (count := converted(output, split)) != len(samples[split]):
            write_file(output, f"{split}/index.json", None)
            raise ConfigError(
                f"converting {split} stopped after {count or 0} of {len(samples[split])} images "
                "(a worker process ended early); run the same command again to convert it"
            )
        done[split] = wanted
        write_file(output, CONVERTED, json.dumps(done, indent=2).encode())
    metadata = {
        "class_names": list(folder.class_names),
        "input_shape": list(folder.input_shape),
        "samples": {split: len(samples[split]) for split in SPLITS},
        "source": str(folder.root),
    }
    write_file(output, METADATA, json.dumps(metadata, indent=2).encode())
    return metadata


def shard(samples: list[list], output: str, workers: int, chunk_bytes: str, afresh: bool) -> None:
    """LitData's optimize over the samples, in parallel, resumable (its checkpoints)."""
    if afresh and not is_remote(output):
        shutil.rmtree(output, ignore_errors=True)
    optimize(
        fn=encode,
        inputs=samples,
        output_dir=output,
        chunk_bytes=chunk_bytes,
        num_workers=workers,
        use_checkpoint=True,
        reorder_files=False,  # keep the order: shard k holds a contiguous run of files
        # Into a bucket, LitData stages the shards locally and does not go on from a stopped
        # upload: a split that is not finished there starts over.
        **({"mode": "overwrite"} if is_remote(output) else {}),
    )


def samples_of(dataset: Dataset) -> list[tuple[str, int]]:
    """(file, label) of every sample of an ImageFolder, or of a subset or concatenation of them."""
    if isinstance(dataset, Subset):
        inner = samples_of(dataset.dataset)
        return [inner[i] for i in dataset.indices]
    if isinstance(dataset, ConcatDataset):
        return [s for part in dataset.datasets for s in samples_of(part)]
    if isinstance(dataset, datasets.ImageFolder):
        return list(dataset.samples)
    raise TypeError(f"cannot list the files of a {type(dataset).__name__}")


class ImageShards(StreamingDataset):
    """Shard items as (image, label): the stored file decoded to RGB, then `image_transform`."""

    def __init__(self, input_dir: str, image_transform: Callable, **options: Any) -> None:
        super().__init__(input_dir, **options)
        self.image_transform = image_transform

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, int]:
        item = super().__getitem__(index)
        # As the folder's dataset reads a file.
        return self.image_transform(open_rgb(io.BytesIO(item["image"]))), item["label"]


class ShardsLoader(StreamingDataLoader):
    """LitData's loader, ending a resumed epoch where Lightning ends it.

    After `load_state_dict` the loader replays the interrupted epoch's order, and clears that
    only when the epoch runs into StopIteration. Lightning ends an epoch at the loader's length
    without asking for one more batch, so the next epoch would replay the resumed one again;
    here the next epoch starts as a new one.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resumed_epoch_started = False

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
        folds: int | None = None,
        fold: int = 0,
    ) -> None:
        super().__init__(batch_size, num_workers, val_fraction=0.1, seed=seed)
        if folds is not None:
            raise ConfigError(
                "data.folds: shards keep the splits they were converted with; cross-validate "
                "from the image folder (--data.root) instead"
            )
        self.input_dir = location_of(input_dir, "data.input_dir")
        metadata = read_metadata(self.input_dir)
        self.class_names = tuple(metadata["class_names"])
        size = image_size or metadata["input_shape"][-1]
        self.image_size = size
        self.input_shape = (3, size, size)
        # Remote shards are downloaded as they are read; each split's cache stays within
        # max_cache_size, so that a data set larger than the disk still streams.
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
        # the loader's state holds the position for an exact resume. Workers start anew each
        # epoch: LitData hands them the epoch's share when they start.
        return ShardsLoader(
            dataset,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            pin_memory=on_gpu,
            # Its own generator: starting an epoch's workers never draws from the global RNG
            # that dropout uses (a resumed run starts its loaders at other moments).
            generator=torch.Generator().manual_seed(self.loader_seed() + 1),
            multiprocessing_context=self.worker_server(dataset),
            worker_init_fn=self.worker_init(),
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
    parser.add_argument(
        "--image_size", type=int, default=64,
        help="the input size training uses by default (images are stored as they are)",
    )  # fmt: skip
    parser.add_argument(
        "--val_fraction", type=float, default=0.1,
        help="without a val folder: the share of train held out (as training from the folder)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="of that share (as data.seed)")
    parser.add_argument(
        "--workers", type=int, default=None, help="default: one per 1000 images, at most every CPU"
    )
    parser.add_argument("--chunk_bytes", default="64MB", help="the size of one shard")
    args = parser.parse_args(argv)
    try:
        metadata = convert(
            args.root, args.output, args.image_size, args.val_fraction, args.seed,
            args.workers, args.chunk_bytes,
        )  # fmt: skip
    except (ConfigError, OSError) as error:
        raise SystemExit(f"error: {error}") from None
    except Exception as error:
        if not type(error).__module__.startswith(("botocore", "boto3")):
            raise
        # The store's own errors (credentials, endpoint, bucket, permissions), on one line.
        raise SystemExit(f"error: {args.output}: {str(error).splitlines()[0]}") from None
    counts = ", ".join(f"{n} {split}" for split, n in metadata["samples"].items())
    print(f"Shards: {args.output} ({counts} images, {len(metadata['class_names'])} classes)")
    output = shlex.quote(args.output)
    print(f"Train:  python train.py --data configs/data/shards.yaml --data.input_dir {output}")
