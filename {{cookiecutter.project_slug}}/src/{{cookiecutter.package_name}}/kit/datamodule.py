"""What every data module here shares: seeded splits and well-configured loaders.

The dataset itself (where images come from, their transforms) lives in data.py.
Datasets that fit in memory use `InMemoryDataModule`: decoded once into uint8 tensors,
cut into batches by indexing, augmented and normalised as whole batches on the device.
"""

import functools
import multiprocessing
import os
import signal
import sys
import types
import warnings
from collections.abc import Callable, Sequence
from multiprocessing.context import BaseContext
from multiprocessing.reduction import ForkingPickler
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import suggested_max_num_workers
from torch import Tensor
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

from .errors import ConfigError
from .workers import Batch, start_worker, whole_batch
from .workers import TensorImages as TensorImages  # data modules import it from here

# What ImageDataModule.check_contract looks for besides prediction_transform.
CONTRACT = ("class_names", "input_shape", "mean", "std")


class ImageDataModule(L.LightningDataModule):
    """The data contract: what every data module of this project provides.

    Set in `__init__`, before any data is read (the model is built from them):
      class_names   one name per class, in label order
      input_shape   (C, H, W) of one image as the model takes it
    Members of the class (prediction, export and serving use them without any data):
      mean, std     the per-channel normalisation the model's input has had
      prediction_transform(input_shape)   an RGB PIL image -> one model input
    Batches: `setup` assigns `train_set`, `val_set`, `test_set`, whose loaders give
    (images, labels) as the model gets them: float (N, C, H, W) and int64 (N,). `split`
    holds out the validation part (a seeded fraction, or fold `fold` of `folds`).
    Loaders come from `make_loader`; override it (not `train_dataloader`) to change them:
    `train_dataloader` restores the loader's position for an exact resume, through
    `restore_loader` (override it too for a loader other than torchdata's StatefulDataLoader).
    `check_contract` names a missing member on one line when the run starts.
    """

    class_names: Sequence[str]
    input_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # How the loader joins what the dataset returns into a batch; None: torch's default_collate.
    collate_fn: Callable[[Any], Any] | None = None

    @staticmethod
    def prediction_transform(input_shape: tuple[int, int, int]) -> Callable[[Any], Tensor]:
        raise NotImplementedError  # check_contract refuses a data module without its own

    def check_contract(self) -> None:
        """Refuse, on one line, a data module that lacks a member of the contract."""
        name = type(self).__name__
        missing = [m for m in CONTRACT if not hasattr(type(self), m) and m not in vars(self)]
        if type(self).prediction_transform is ImageDataModule.prediction_transform:
            missing.append("prediction_transform")
        if missing:
            raise ConfigError(
                f"data module {name} does not set {', '.join(missing)} (the contract in "
                "datamodule.ImageDataModule: class_names and input_shape in __init__; mean, "
                "std and prediction_transform on the class)"
            )
        if type(self).train_dataloader is not ImageDataModule.train_dataloader:
            raise ConfigError(
                f"data module {name} overrides train_dataloader, which would lose the "
                "loader's position on resume; override make_loader(dataset, shuffle) instead"
            )

    def __getattr__(self, name: str) -> Any:
        # Reached only for a missing attribute: a contract member says which, in one line.
        if name in CONTRACT:
            self.check_contract()
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __init__(
        self,
        batch_size: int,
        num_workers: int | None,
        val_fraction: float,
        seed: int,
        folds: int | None = None,
        fold: int = 0,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ConfigError(f"data.batch_size must be a positive integer, got {batch_size}")
        if not 0 < val_fraction < 1:
            raise ConfigError(f"data.val_fraction must be between 0 and 1, got {val_fraction}")
        if num_workers is not None and num_workers < 0:
            raise ConfigError(f"data.num_workers must be 0 or more, got {num_workers}")
        if folds is not None and not (folds >= 2 and 0 <= fold < folds):
            raise ConfigError(
                f"data.folds {folds} with data.fold {fold}: folds must be 2 or more and fold "
                "one of 0 .. folds-1 (or data.folds null: a val_fraction split)"
            )
        self.folds, self.fold = folds, fold
        self.batch_size = batch_size
        self._num_workers = num_workers
        self.val_fraction = val_fraction
        self.seed = seed
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self._resume_from: dict[str, Any] | None = None
        self._epoch_finished = False

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def num_workers(self) -> int:
        """Each loader's workers: as given, else a share of the CPUs (`default_num_workers`)
        for each process of the run on this machine (the Trainer's devices, once attached)."""
        if self._num_workers is not None:
            return self._num_workers
        return default_num_workers(self.trainer.num_devices if self.trainer is not None else 1)

    @num_workers.setter
    def num_workers(self, num_workers: int | None) -> None:
        self._num_workers = num_workers

    def train_dataloader(self) -> DataLoader:
        loader = self.make_loader(self.train_set, shuffle=True)
        if self._resume_from is not None:
            self.restore_loader(loader, self._resume_from, self._epoch_finished)
            self._resume_from = None
        return loader

    def restore_loader(
        self, loader: DataLoader, state: dict[str, Any], epoch_finished: bool
    ) -> None:
        """Put a new training loader where the checkpoint's was (`make_loader`'s kind)."""
        loader.load_state_dict(state)
        if epoch_finished:
            # Replay the finished epoch's order once, leaving the shuffling generator where
            # the next epoch starts, as it was in the run that wrote the checkpoint.
            iter(loader)

    def val_dataloader(self) -> DataLoader:
        return self.make_loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self.make_loader(self.test_set)

    def predict_dataloader(self) -> DataLoader:
        return self.make_loader(self.test_set)

    def state_dict(self) -> dict[str, Any]:
        """What Lightning stores in every checkpoint: the class names and this class (predict
        and export name classes and preprocess images without the data) and the training
        loader's position (shuffled order, batches served) for an exact resume."""
        data_class = f"{type(self).__module__}.{type(self).__qualname__}"
        state: dict[str, Any] = {"class_names": list(self.class_names), "class_path": data_class}
        loader = self.trainer.train_dataloader if self.trainer is not None else None
        if callable(getattr(loader, "state_dict", None)):  # a loader that can resume
            state["train_loader"] = loader.state_dict()
            served = self.trainer.fit_loop.epoch_loop.batch_progress.current.ready
            state["epoch_finished"] = served >= self.trainer.num_training_batches
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Restored before the Trainer first asks for the loader (it does so early, to size the
        # LR schedule, before its own loop state is restored), so the first loader resumes.
        self._resume_from = state_dict.get("train_loader")
        self._epoch_finished = state_dict.get("epoch_finished", False)

    def split(self, train: Dataset, evaluation: Dataset) -> tuple[Subset, Subset]:
        """Seeded train/val split of one dataset seen through two transforms.

        `train` and `evaluation` hold the same samples; only the training part
        gets augmentation. With `folds`, validation is fold `fold` of a stratified k-fold
        split (each class in the same proportion in every fold); else `val_fraction` of it.
        """
        if self.folds is not None:
            return cross_validation_fold(train, evaluation, self.folds, self.fold, self.seed)
        generator = torch.Generator().manual_seed(self.seed)
        order = torch.randperm(len(train), generator=generator).tolist()
        n_val = max(1, round(len(order) * self.val_fraction))
        return Subset(train, order[n_val:]), Subset(evaluation, order[:n_val])

    def make_loader(self, dataset: Dataset | None, shuffle: bool = False) -> DataLoader:
        if dataset is None:
            raise RuntimeError("call setup() before asking for a data loader")
        on_gpu = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        # A stateful loader with its own generator: checkpoints record the shuffled order and
        # the position in it, so a run resumed mid-epoch sees exactly the batches it missed,
        # and creating loaders never draws from the global RNG that dropout uses.
        # The sampler's generator draws only the order: after a restore it is set back to the
        # interrupted epoch's state, so the epochs after it shuffle as they would have.
        order = torch.Generator().manual_seed(self.loader_seed())
        return StatefulDataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=RandomSampler(dataset, generator=order) if shuffle else None,
            num_workers=self.num_workers,
            pin_memory=on_gpu,
            persistent_workers=self.num_workers > 0,
            generator=torch.Generator().manual_seed(self.loader_seed() + 1),
            collate_fn=self.collate_fn,
            multiprocessing_context=self.worker_server(dataset, self.collate_fn),
            worker_init_fn=self.worker_init(),
        )

    def loader_seed(self) -> int:
        """The seed of the batches' order: data.seed and the run's --seed_everything.

        Runs repeated over seeds then differ in their order too, not only in their initial
        weights, while data.seed alone fixes the split. Every process of a run has the same
        (Lightning's seed_everything sets PL_GLOBAL_SEED for the processes it starts).
        """
        return self.seed * 1_000_003 + int(os.environ.get("PL_GLOBAL_SEED", 0))

    def worker_init(self) -> Callable[[int], None]:
        """The loaders' worker_init_fn: `workers.start_worker` with this process's id and rank."""
        rank = self.trainer.global_rank if self.trainer is not None else 0
        return functools.partial(start_worker, main_process=os.getpid(), rank=rank)

    def worker_server(self, *sent: Any) -> BaseContext | None:
        """Where loader workers start: a fork server on Linux, the platform's default elsewhere
        (None without workers).

        Forking a worker straight from a process that runs other threads (progress bars, queue
        feeders, torch.distributed's) can leave the worker stuck inside fork on Python before
        3.11.10 (CPython gh-112275), and a run with several devices then waits for it forever.
        The fork server has no threads: it imports what the workers need once and forks every
        worker from there: workers.py and the modules of what the loader sends its workers
        (`sent`: the dataset, the collate function), found by pickling them as the loader will;
        Lightning only where those need it (a dataset defined beside a data module). Each
        worker also runs the main script's top level again (the server does so once instead
        from Python 3.13.1, CPython gh-126631), which is why the entry scripts import under
        their main guard.

        It starts with SIGTERM blocked, which its threads keep: a SIGTERM to the whole process
        group (`kill -- -PGID`, `timeout`, a scheduler's time limit) must not end it, since the
        main process learns from the server that a worker has ended. With the server gone it
        takes running workers for ended, exits under them, and a worker's clean-up then fails
        in the main process's temporary folder, which is gone. The server still ends with its
        main process; the processes it forks start unblocked (`workers.py`).
        """
        if self.num_workers == 0 or not sys.platform.startswith("linux"):
            return None
        from multiprocessing import forkserver, resource_tracker  # Linux only, here

        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([f"{__package__}.workers", "__main__", *modules_of(sent)])
        # The server starts the resource tracker first, which unblocks SIGTERM after starting.
        resource_tracker.ensure_running()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            forkserver.ensure_running()  # the server, a new program, inherits the mask
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return context


def cross_validation_fold(
    train: Dataset, evaluation: Dataset, folds: int, fold: int, seed: int
) -> tuple[Subset, Subset]:
    """Fold `fold` of a seeded, stratified k-fold split: (the other folds, this fold)."""
    # Imported here: scikit-learn is slow to import and runs without folds never need it.
    from sklearn.model_selection import StratifiedKFold

    labels = labels_of(train).numpy()
    counts = torch.bincount(torch.as_tensor(labels))
    if (smallest := int(counts[counts > 0].min())) < folds:
        raise ConfigError(
            f"data.folds {folds}: the smallest class has {smallest} training sample(s), and "
            "every fold needs one of each class; use fewer folds"
        )
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    rest, held_out = list(splitter.split(labels, labels))[fold]
    return Subset(train, rest.tolist()), Subset(evaluation, held_out.tolist())


def labels_of(dataset: Dataset) -> Tensor:
    """The label of every sample, read without decoding images where the dataset knows them
    (`labels`, torchvision's `targets`, subsets and concatenations of those)."""
    if isinstance(dataset, Subset):
        return labels_of(dataset.dataset)[torch.as_tensor(dataset.indices, dtype=torch.long)]
    if isinstance(dataset, ConcatDataset):
        return torch.cat([labels_of(part) for part in dataset.datasets])
    for name in ("labels", "targets"):
        if (found := getattr(dataset, name, None)) is not None:
            return torch.as_tensor(found, dtype=torch.long)
    return torch.as_tensor([int(dataset[i][1]) for i in range(len(dataset))], dtype=torch.long)


class InMemoryDataModule(ImageDataModule):
    """For datasets held as `TensorImages`: raw uint8 batches go to the device, where
    `augment` (training only) and `normalise` process each whole batch at once.

    `normalise` is the same preprocessing that validation, test and prediction apply to
    one image, so a batch's rows equal the images preprocessed one by one.
    """

    # uint8 pixels (one image or a batch) -> the model's float input; set by subclasses.
    normalise: Callable[[Tensor], Tensor]

    # A function of workers.py: the workers' fork server imports its module, not this one.
    collate_fn = staticmethod(whole_batch)

    def make_loader(self, dataset: Dataset | None, shuffle: bool = False) -> DataLoader:
        if self.num_workers == 0:
            # Lightning suggests workers to every loader without them (on machines with more
            # than 2 CPUs); here a batch is one indexing operation, which workers would slow.
            warnings.filterwarnings("ignore", message=r"The '\w+_dataloader' does not have many")
        return super().make_loader(dataset, shuffle)

    def augment(self, images: Tensor) -> Tensor:
        """Random augmentation of a uint8 batch, drawn per image from the global torch RNG
        (which checkpoints store, so a resumed run augments as one that never stopped)."""
        return images

    def on_after_batch_transfer(self, batch: Batch | Tensor, dataloader_idx: int) -> Batch | Tensor:
        if isinstance(batch, Tensor):
            # The model summary's example input: already what the model takes.
            return batch
        images, labels = batch
        if self.trainer is not None and self.trainer.training:
            images = self.augment(images)
        return self.normalise(images), labels


def usable_cpus() -> int | None:
    """The CPUs this process may use (a cluster job's share, not the whole machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def default_num_workers(processes: int = 1) -> int:
    """Half of the CPUs this process may use (at least 1, at most 8), within the upper bound
    Lightning suggests for `processes` processes on this machine (their CPUs shared out, one
    left to each process itself)."""
    return max(1, min(8, (usable_cpus() or 2) // 2, suggested_max_num_workers(processes)))


class _ModuleFinder(ForkingPickler):
    """Pickles as a loader does when it starts a worker, into nothing, noting the module of
    every class and function on the way: what a worker imports to read what it is sent."""

    def __init__(self) -> None:
        super().__init__(_Nowhere())
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        named = obj if isinstance(obj, type | types.FunctionType) else type(obj)
        self.modules.add(getattr(named, "__module__", None) or "builtins")
        if isinstance(obj, Tensor | torch.UntypedStorage | torch.TypedStorage):
            # Left out: torch's reducers would move their memory into shared memory.
            return torch.empty, (0,)
        return NotImplemented


class _Nowhere:
    def write(self, data: bytes) -> None:
        pass


def modules_of(sent: Sequence[Any]) -> list[str]:
    """The modules a worker imports to unpickle `sent`.

    When something cannot be pickled here, the loader will say so itself, in its own words;
    the server then imports only what it always does.
    """
    finder = _ModuleFinder()
    try:
        finder.dump(list(sent))
    except Exception:  # the loader reports it
        return []
    found = {"__main__" if name == "__mp_main__" else name for name in finder.modules}
    return sorted(found - {"builtins"})
