"""The data module yields what the model expects: seeded split, train-only augmentation."""

import gc
import itertools
import multiprocessing
import os
{%- if cookiecutter.dataset == "image_folder" %}
import shutil
{%- endif %}
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

{% if cookiecutter.dataset == "image_folder" -%}
import fake_data
{% endif -%}
import pytest
import torch
from lightning import Trainer
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset

from {{ cookiecutter.package_name }}.data import DataModule
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


def test_loaders_pin_memory_only_on_gpu_and_keep_workers(
    make_datamodule: Callable[..., DataModule],
) -> None:
    dm = make_datamodule(num_workers=1)
    dm.trainer = Trainer(accelerator="cpu", devices=1, logger=False)
    dm.prepare_data()
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.pin_memory is False
    assert loader.persistent_workers is True
    assert loader.num_workers == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a fork server on Linux only")
def test_workers_start_from_a_fork_server(make_datamodule: Callable[..., DataModule]) -> None:
    """Forked from the training process, which runs other threads, a worker can hang at start."""
    dm = make_datamodule(num_workers=1)
    dm.prepare_data()
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    images, labels = next(iter(loader))
    assert len(images) == len(labels) > 0


def test_default_workers_are_a_share_of_the_cpus(
    make_datamodule: Callable[..., DataModule],
) -> None:
    assert make_datamodule(num_workers=None).num_workers >= 1


def test_default_workers_leave_cpus_to_every_process_of_the_run(
    make_datamodule: Callable[..., DataModule], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(8)), raising=False)
    default, given = make_datamodule(num_workers=None), make_datamodule(num_workers=6)
    assert default.num_workers == 4  # one process: half of the 8 CPUs
    for devices, workers in ((2, 3), (4, 1)):  # Lightning's bound: 8 // devices - 1
        default.trainer = given.trainer = Trainer(accelerator="cpu", devices=devices, logger=False)
        assert default.num_workers == workers
        assert given.num_workers == 6  # as given


@pytest.mark.parametrize(
    ("key", "value"), [("batch_size", 0), ("val_fraction", 1.5), ("num_workers", -1)]
)
def test_bad_values_are_refused_by_name(
    make_datamodule: Callable[..., DataModule], key: str, value: float
) -> None:
    with pytest.raises(ConfigError, match=f"data.{key}"):
        make_datamodule(**{key: value})


def fork_servers() -> list[int]:
    """The fork servers this process started (multiprocessing does not list them)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue  # ended meanwhile
        if parent == os.getpid() and b"forkserver" in command:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a fork server on Linux only")
def test_a_sigterm_from_another_process_leaves_loader_workers_running(
    make_datamodule: Callable[..., DataModule],
) -> None:
    """A SIGTERM to the whole job reaches the workers and their fork server too: the main
    process stops the workers itself after saving. Workers the signal killed would make it
    fail; a fork server it killed would make it take running workers for ended (exit status
    255) and exit under them."""
    datamodule = make_datamodule(num_workers=1, batch_size=4)
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    batches = iter(loader)
    next(batches)
    workers = multiprocessing.active_children()
    servers = fork_servers()
    assert workers and servers
    for pid in [*servers, *(worker.pid for worker in workers)]:
        # Sent by `kill`, as `kill -- -PGID` or a scheduler would.
        subprocess.run(["kill", "-s", "TERM", str(pid)], check=True)
    time.sleep(1)
    assert fork_servers() == servers
    assert all(worker.is_alive() for worker in workers)
    # Other processes from the same server end on SIGTERM, as processes do.
    other = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(60,))
    other.start()
    other.terminate()
    other.join(timeout=10)
    assert other.exitcode == -signal.SIGTERM
    assert sum(1 for _ in batches) == len(loader) - 1
    del batches, loader  # the workers stop here, not in a later test
    gc.collect()
    for worker in workers:
        worker.join(timeout=10)  # told to stop, or terminated: either way, they end
    assert not any(worker.is_alive() for worker in workers)


def test_a_process_ends_with_loader_workers_still_running(
    data_args: list[str], tmp_path: Path
) -> None:
    """At exit, multiprocessing ends the workers with SIGTERM from their main process."""
    script = tmp_path / "exit_with_workers.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import fake_data\n"
        "getattr(fake_data, 'trust_local_files', lambda: None)()  # the tiny CIFAR-10 files\n"
        "from {{ cookiecutter.package_name }}.kit.cli import build_cli\n"
        "from {{ cookiecutter.package_name }}.kit.project import use\n"
        "from {{ cookiecutter.package_name }}.project import project\n"
        "use(project)  # as the entry scripts do\n"
        "if __name__ == '__main__':  # loader workers start from a server that imports this\n"
        "    cli = build_cli(sys.argv[1:])\n"
        "    cli.datamodule.setup('fit')\n"
        "    loader = cli.datamodule.train_dataloader()\n"
        "    batches = iter(loader)\n"
        "    next(batches)\n"
        "    print('one batch', flush=True)\n"
    )
    ended = subprocess.run(
        [sys.executable, str(script), *data_args, "--data.num_workers", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ended.returncode == 0, ended.stderr[-3000:]
    assert "one batch" in ended.stdout
