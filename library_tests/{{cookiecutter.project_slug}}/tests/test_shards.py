"""Image folders at scale: the start-up check runs once, and shards (convert.py) stream from
a folder or an S3-compatible store with the folder's samples, splits, transforms and exact
resume."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import fake_data
import pytest
import torch
from conftest import FAST
from litdata import StreamingDataset
from s3_server import s3_server
from shard_probe import fingerprint
from torchvision import datasets

from {{ cookiecutter.package_name }} import data as folder_data
from {{ cookiecutter.package_name }}.data import DataModule, eval_transform
from {{ cookiecutter.package_name }}.kit.errors import ConfigError
from {{ cookiecutter.package_name }}.kit.train import main
from {{ cookiecutter.package_name }}.shards import ImageShards, ShardsDataModule, convert, converted

PROJECT = Path(__file__).resolve().parents[1]
TESTS = PROJECT / "tests"
SHARDS_CONFIG = str(PROJECT / "configs" / "data" / "shards.yaml")
RUN = Path("runs/default")
# Small shards, so that a split spans several and each loader worker gets its own.
CHUNK = "8KB"


@pytest.fixture(scope="session")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("images")
    fake_data.write_dataset(root)
    return root


@pytest.fixture(scope="session")
def shards(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("shards")
    convert(folder, str(output), image_size=16, workers=2, chunk_bytes=CHUNK)
    return output


def with_tests() -> str:
    """PYTHONPATH for a subprocess that imports the helpers in tests/ too (and the project
    from wherever this process imports it)."""
    return os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))


def shard_args(location: str | Path, *args: str) -> list[str]:
    # The shards' config first, then the test-only flags (FAST) that override it.
    return ["--data", SHARDS_CONFIG, "--data.input_dir", str(location), *FAST, *args]


@pytest.fixture
def train_shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable:
    monkeypatch.chdir(tmp_path)
    return lambda location, *args: main(shard_args(location, *args))


def items(location: Path, split: str) -> list[dict]:
    """The stored items of a split, in order, each with its file name as text."""
    dataset = StreamingDataset(str(location / split))
    stored = (dataset[i] for i in range(len(dataset)))
    return [{**item, "file": bytes(item["file"]).decode()} for item in stored]


def test_conversion_round_trip_keeps_every_image_label_split_and_the_class_order(
    folder: Path, shards: Path
) -> None:
    metadata = json.loads((shards / "classes.json").read_text())
    assert metadata["class_names"] == list(fake_data.CLASSES)
    assert metadata["input_shape"] == [3, 16, 16]
    reference = DataModule(root=folder, image_size=16)
    reference.setup("fit")
    # Without a val folder, validation is the folder module's seeded share of train/.
    train = datasets.ImageFolder(folder / "train").samples
    expected = {
        "train": sorted(train[i] for i in reference.train_set.indices),
        "val": sorted(train[i] for i in reference.val_set.indices),
        "test": sorted(datasets.ImageFolder(folder / "test").samples),
    }
    for split, samples in expected.items():
        stored = items(shards, split)
        assert sorted((item["file"], item["label"]) for item in stored) == samples
        for item in stored:  # the file's own bytes: still encoded, decoded when read
            assert bytes(item["image"]) == Path(item["file"]).read_bytes()
        assert metadata["samples"][split] == len(samples)
    assert len(list((shards / "train").glob("*.bin"))) > 2  # several shards to share out


@pytest.mark.parametrize("stop", ["group", "worker"])
def test_a_conversion_killed_part_of_the_way_goes_on_where_it_stopped(
    folder: Path, tmp_path: Path, stop: str
) -> None:
    output = tmp_path / "shards"
    args = ["--root", str(folder), "--output", str(output), "--workers", "1"]
    args += ["--chunk_bytes", CHUNK]
    dies = "from {{ cookiecutter.package_name }} import shards; import shard_probe; "
    dies += "shards.encode = shard_probe.encode_until_stop; shards.main()"
    stop_at = train_samples(folder)[30][0]  # in the middle of train
    environment = {**os.environ, "PYTHONPATH": with_tests(), "STOP_AT": str(stop_at), "STOP": stop}
    killed = subprocess.run(
        [sys.executable, "-c", dies, *args], env=environment, capture_output=True, text=True,
        timeout=300, start_new_session=True,  # a process group of its own, to be killed
    )  # fmt: skip
    assert killed.returncode != 0
    if stop == "worker":  # the conversion itself goes on, and says what happened
        said = r"error: converting train stopped after \d+ of \d+ images .* to convert it"
        assert [line for line in killed.stderr.splitlines() if re.fullmatch(said, line)]
    assert converted(str(output), "train") is None  # train is not finished
    written = {path: path.stat().st_mtime_ns for path in (output / "train").glob("*.bin")}
    assert written  # but some of its shards are

    result = subprocess.run(
        [sys.executable, str(PROJECT / "convert.py"), *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    if stop == "group":  # it went on: the shards written before the kill stay as they were
        assert all(path.stat().st_mtime_ns == mtime for path, mtime in written.items())
    files = sorted(item["file"] for item in items(output, "train"))
    assert files == sorted(str(path) for path, _ in train_samples(folder))
    if stop == "worker":
        return  # what follows does not depend on how the conversion stopped
    # Once more: every split is kept as it is.
    kept = {path: path.stat().st_mtime_ns for path in output.rglob("index.json")}
    again = subprocess.run(
        [sys.executable, str(PROJECT / "convert.py"), *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.stdout.count("converted already") == 3, again.stdout
    assert kept == {path: path.stat().st_mtime_ns for path in output.rglob("index.json")}
    # Another seed holds out other images: train and val are converted again, test is kept.
    reseeded = subprocess.run(
        [sys.executable, str(PROJECT / "convert.py"), *args, "--seed", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert reseeded.stdout.count("converted already") == 1, reseeded.stdout  # test
    files = sorted(item["file"] for item in items(output, "val"))
    assert files == sorted(str(path) for path, _ in held_out(folder, seed=1))


def train_samples(folder: Path, seed: int = 0) -> list[tuple[str, int]]:
    """The folder module's training samples (without a val folder: after the held-out share)."""
    reference = DataModule(root=folder, image_size=16, seed=seed)
    reference.setup("fit")
    train = datasets.ImageFolder(folder / "train").samples
    return [train[i] for i in reference.train_set.indices]


def held_out(folder: Path, seed: int = 0) -> list[tuple[str, int]]:
    """The folder module's validation samples, held out of train/."""
    reference = DataModule(root=folder, image_size=16, seed=seed)
    reference.setup("fit")
    train = datasets.ImageFolder(folder / "train").samples
    return [train[i] for i in reference.val_set.indices]


def test_a_bad_image_is_named_before_anything_is_converted(folder: Path, tmp_path: Path) -> None:
    root = tmp_path / "images"
    fake_data.write_dataset(root)
    (root / "train" / "dog" / "4.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    result = subprocess.run(
        [sys.executable, str(PROJECT / "convert.py"), "--root", str(root), "--output", "out"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: {root / 'train' / 'dog' / '4.png'} is not a readable image "
        + result.stderr.split("is not a readable image ", 1)[1].strip()
    ]
    assert not (tmp_path / "out").exists()


def test_missing_shards_and_settings_shards_cannot_have_are_refused(
    tmp_path: Path, shards: Path
) -> None:
    with pytest.raises(ConfigError, match=r"holds no finished conversion.*python convert.py"):
        ShardsDataModule(input_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"data.input_dir 'gs://b/x': a folder or an s3://"):
        ShardsDataModule(input_dir="gs://b/x")
    with pytest.raises(ConfigError, match=r"data.folds: shards keep the splits"):
        ShardsDataModule(input_dir=str(shards), folds=3)


def test_training_and_testing_from_local_shards(
    train_shards: Callable, shards: Path, folder: Path
) -> None:
    metrics = train_shards(shards)
    assert set(metrics) >= {"test/acc", "test/loss"}
    config = (RUN / "version_0" / "config.yaml").read_text()
    assert "ShardsDataModule" in config
{%- if cookiecutter.deploy == "yes" %}
    from {{ cookiecutter.package_name }}.kit.inference import load_classifier

    # Prediction needs no shards: the checkpoint names the data module's preprocessing.
    classifier = load_classifier(RUN / "version_0" / "checkpoints" / "last.ckpt")
    assert classifier.class_names == list(fake_data.CLASSES)
{%- endif %}


def test_streamed_batches_are_the_folder_images_through_the_same_transforms(
    shards: Path, folder: Path
) -> None:
    streamed = ShardsDataModule(input_dir=str(shards), batch_size=4, num_workers=0)
    streamed.setup("fit")
    images, labels = next(iter(streamed.val_dataloader()))
    assert images.shape == (4, 3, 16, 16) and labels.dtype == torch.int64
    evaluation = folder_data.eval_transform(16)
    first = items(shards, "val")[0]
    reference = datasets.ImageFolder(Path(first["file"]).parents[1], transform=evaluation)
    expected = reference[[path for path, _ in reference.samples].index(first["file"])][0]
    assert torch.equal(images[0], expected)


@pytest.mark.parametrize(
    ("every", "saved_at"), [(3, 6), (5, 5)], ids=["mid-epoch", "at an epoch's end"]
)
def test_kill_then_resume_from_shards_matches_an_uninterrupted_run(
    train_shards: Callable, shards: Path, tmp_path: Path, every: int, saved_at: int
) -> None:
    """The resumed run reads exactly the images the killed run had not, in the same order and
    with the same augmentations, and the epochs after it as the uninterrupted run did."""
    exact = [
        "--trainer.deterministic", "true", "--max_epochs", "3",
        "--trainer.limit_train_batches", "1.0", "--data.batch_size", "16",
        "--step_checkpoint.every_n_train_steps", str(every),
    ]  # fmt: skip
    uninterrupted = train_shards(shards, *exact)
    killed = subprocess.run(
        [sys.executable, str(PROJECT / "train.py"), *shard_args(shards, *exact),
         "--trainer.callbacks+=interrupt.SignalAtStep", "--trainer.callbacks.init_args.step", "7"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": with_tests()},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    saved = torch.load(RUN / "version_1/checkpoints/last.ckpt", weights_only=True)
    assert saved["global_step"] == saved_at  # 5 batches an epoch
    resumed = train_shards(shards, *exact, "--ckpt_path", "last", "--trainer.callbacks", "[]")
    assert resumed == uninterrupted  # same test metrics, to the last bit
    reference = torch.load(RUN / "version_0/checkpoints/last.ckpt", weights_only=True)
    final = torch.load(RUN / "version_1/checkpoints/last.ckpt", weights_only=True)
    assert final["global_step"] == reference["global_step"] == 15
    for name, tensor in reference["state_dict"].items():
        assert torch.equal(final["state_dict"][name], tensor), name


# Lightning's own launcher, and torchrun: LitData finds the rank and the world either way.
LAUNCHERS = {
    "lightning": [],
    "torchrun": ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
}


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_two_processes_see_every_training_image_once_per_epoch(
    shards: Path, tmp_path: Path, launcher: str
) -> None:
    seen = tmp_path / "seen"
    result = subprocess.run(
        [sys.executable, *LAUNCHERS[launcher], str(PROJECT / "train.py"), *shard_args(shards),
         "--devices", "2", "--data.num_workers", "2", "--data.batch_size", "4",
         "--trainer.limit_train_batches", "1.0", "--max_epochs", "2",
         "--trainer.callbacks+=shard_probe.RecordSamples",
         "--trainer.callbacks.init_args.folder", str(seen)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": with_tests()},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    stored = ImageShards(str(shards / "train"), eval_transform(16))
    files = [item["file"] for item in items(shards, "train")]
    file_of = {fingerprint(stored[i][0]): files[i] for i in range(len(stored))}
    every = set(files)
    for epoch in (0, 1):
        ranks = [
            [file_of[f] for f in json.loads((seen / f"epoch{epoch}_rank{r}.json").read_text())]
            for r in (0, 1)
        ]
        files = ranks[0] + ranks[1]
        assert len(ranks[0]) == len(ranks[1])  # in step: the same number of batches
        assert len(files) == len(set(files)), "an image was seen twice in one epoch"
        assert set(files) <= every
        # LitData drops the last few of an epoch so the processes stay in step.
        assert len(every) - len(files) < 2 * 2 * 4


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """An S3-compatible server on loopback holding an empty bucket; yields its s3:// URL."""
    import boto3

    with s3_server(tmp_path) as variables:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        boto3.client("s3").create_bucket(Bucket="images")
        yield "s3://images/shards"


def test_training_from_an_s3_bucket_keeps_the_cache_within_its_limit(
    s3: str, folder: Path, train_shards: Callable, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import boto3

    # An image folder with its own val/ this time.
    with_val = tmp_path / "images"
    shutil.copytree(folder, with_val)
    shutil.copytree(with_val / "test", with_val / "val")
    metadata = convert(with_val, s3, image_size=16, workers=1, chunk_bytes=CHUNK)
    assert metadata["class_names"] == list(fake_data.CLASSES)
    val_files = sorted(str(path) for path in (with_val / "val").rglob("*.png"))
    assert sorted(bytes(item["file"]).decode() for item in remote_items(s3, "val")) == val_files
    capsys.readouterr()
    convert(with_val, s3, image_size=16, workers=1, chunk_bytes=CHUNK)  # again: nothing to do
    assert capsys.readouterr().out.count("converted already") == 3
    listing = boto3.client("s3").list_objects_v2(Bucket="images")["Contents"]
    stored = sum(o["Size"] for o in listing if o["Key"].startswith("shards/train/chunk"))
    cache, limit = tmp_path / "cache", 30_000
    assert stored > 2 * limit  # more than the cache may hold: it has to make room
    metrics = train_shards(
        s3, "--data.cache_dir", str(cache), "--data.max_cache_size", str(limit),
        "--trainer.limit_train_batches", "1.0", "--max_epochs", "2",
        "--trainer.callbacks+=shard_probe.CacheSize",
        "--trainer.callbacks.init_args.folder", str(cache / "train"),
    )  # fmt: skip
    assert set(metrics) >= {"test/acc", "test/loss"}
    sizes = json.loads((cache / "train_sizes.json").read_text())
    assert max(sizes) > 0, "nothing was read into the cache"
    assert max(sizes) <= limit, sizes


def remote_items(location: str, split: str) -> list[dict]:
    dataset = StreamingDataset(f"{location}/{split}")
    return [dataset[i] for i in range(len(dataset))]


def test_the_folder_check_runs_once_and_again_when_a_file_changes(
    folder: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = Path(shutil.copytree(folder, tmp_path / "images"))  # its files change below
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    decoded: list[Path] = []
    check = folder_data.check_images
    monkeypatch.setattr(
        folder_data, "check_images", lambda files: decoded.extend(files) or check(files)
    )
    files = sorted([*(folder / "train").rglob("*.png"), *(folder / "test").rglob("*.png")])

    DataModule(root=folder)
    assert sorted(decoded) == files  # the first start decodes every image
    decoded.clear()
    DataModule(root=folder)
    assert decoded == []  # the next starts only list them
    changed = folder / "test" / "cat" / "0.png"
    os.utime(changed, ns=(changed.stat().st_atime_ns, changed.stat().st_mtime_ns + 1))
    DataModule(root=folder)
    assert sorted(decoded) == files  # a changed file: checked again
    decoded.clear()
    from lightning.pytorch.utilities import rank_zero_only

    (tmp_path / "cache").rename(tmp_path / "gone")
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    DataModule(root=folder)
    assert decoded == []  # another process of the run: the first process checks
