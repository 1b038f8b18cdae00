"""Measurements run inside one rendered project (its src/ and tests/ on sys.path).

bench.py starts this script once per project and question; it prints one JSON object.
Every side of a comparison runs in this one process, interleaved A/B/C/A/B/C, so drift of
a shared machine spreads over all sides alike.
"""

import argparse
import cProfile
import importlib
import json
import os
import pstats
import tempfile
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision.transforms import v2


class Clock(Callback):
    """Wall time of every epoch (training steps, validation, checkpoints, logging), of its
    training steps alone, of its validation loop and of its checkpoint writes; and of every
    drawing of the training curves."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.epochs: list[dict[str, float]] = []
        self.losses: list[float] = []
        self.val_losses: list[float] = []
        self.drawings: list[float] = []

    def sync(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        save = trainer.save_checkpoint

        def timed_save(*args: Any, **kwargs: Any) -> None:
            start = self.sync()
            save(*args, **kwargs)
            if self.epochs:
                self.epochs[-1]["checkpoint"] += self.sync() - start

        trainer.save_checkpoint = timed_save
        # The curves are drawn at most once a minute and at the end of fit: each drawing is
        # timed on its own, since a short fit never draws during an epoch.
        for callback in trainer.callbacks:
            if type(callback).__name__ == "TrainingCurves":
                draw = callback.draw

                def timed_draw(draw: Callable[[], None] = draw) -> None:
                    start = time.perf_counter()
                    draw()
                    self.drawings.append(time.perf_counter() - start)

                callback.draw = timed_draw

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        now = self.sync()
        self.close_epoch(now)
        self.epochs.append({"start": now, "checkpoint": 0.0, "validation": 0.0, "steps": 0.0})
        self.loss_sum = torch.zeros((), device=self.device)
        self.batches = 0

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.loss_sum += outputs["loss"].detach()
        self.batches += 1

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.val_start = self.sync()
        if self.epochs and not trainer.sanity_checking:
            self.epochs[-1]["steps"] = self.val_start - self.epochs[-1]["start"]

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.epochs and not trainer.sanity_checking:
            self.epochs[-1]["validation"] = self.sync() - self.val_start
            self.val_losses.append(float(trainer.callback_metrics["val/loss"]))

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.losses.append(float(self.loss_sum) / max(1, self.batches))

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.close_epoch(self.sync())

    def close_epoch(self, now: float) -> None:
        if self.epochs and "total" not in self.epochs[-1]:
            self.epochs[-1]["total"] = now - self.epochs[-1]["start"]


def trainer_side(package: str, args: list[str], device: torch.device) -> dict[str, Any]:
    """One fit of the project's own CLI-built Trainer; per-epoch times and losses."""
    cli = importlib.import_module(f"{package}.kit.cli")
    clock = Clock(device)
    importlib.import_module(f"{package}.kit.runs").quiet_known_noise()
    built = cli.build_cli(args, callbacks=[clock])
    built.trainer.fit(built.model, datamodule=built.datamodule)
    return {
        "epochs": clock.epochs,
        "steps_per_epoch": clock.batches,
        "losses": clock.losses,
        "val_losses": clock.val_losses,
        "drawings": clock.drawings,
    }


class PerImage(Dataset):
    """The classic path: one (uint8 image, label) at a time through a torchvision transform."""

    def __init__(self, samples: Dataset, transform: Callable[[Any], Tensor]) -> None:
        self.samples, self.transform = samples, transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image, label = self.samples[index]
        return self.transform(image), label


def classic_sets(package: str, dm: Any) -> tuple[Dataset, Dataset]:
    """Train and val sets of the classic path: torchvision's own dataset class decoding
    every image on access where there is one, per-image torchvision transforms."""
    data = importlib.import_module(f"{package}.data")
    augment = importlib.import_module("test_batch_augment").PER_IMAGE_AUGMENTATION
    train_tf = v2.Compose([v2.ToImage(), augment, data.eval_transform()])
    eval_tf = v2.Compose([v2.ToImage(), data.eval_transform()])
    if hasattr(data, "DATASET"):
        train = Subset(data.DATASET(dm.root, train=True, transform=train_tf), dm.train_set.indices)
        val = Subset(data.DATASET(dm.root, train=True, transform=eval_tf), dm.val_set.indices)
        return train, val
    return PerImage(dm.train_set, train_tf), PerImage(dm.val_set, eval_tf)


def plain_side(
    package: str,
    data_kwargs: dict[str, Any],
    epochs: int,
    limit: int | None,
    device: torch.device,
    classic: bool,
    test: bool = False,
) -> dict[str, Any]:
    """The hand-written loop: train_one_epoch (zero_grad/backward/step) and evaluate
    (no_grad), same backbone, optimizer, schedule, batch size and number of steps; with
    `test`, the accuracy of the last epoch's network on the test split too."""
    data = importlib.import_module(f"{package}.data")
    schedules = importlib.import_module(f"{package}.kit.schedules")
    datamodule = importlib.import_module(f"{package}.kit.datamodule")
    # The network and loss exactly as train.py builds them, seed and initial weights included
    # (the project's configs/default.yaml: ConvNet stored channels-last, label smoothing).
    cli = importlib.import_module(f"{package}.kit.cli")
    flags = [
        arg
        for key, value in data_kwargs.items()
        for arg in (f"--data.{key}", value if isinstance(value, str) else json.dumps(value))
    ]
    model = cli.build_model([*flags, "--accelerator", "cpu", "--devices", "1"])
    network = model.backbone.to(device)
    dm = data.DataModule(**data_kwargs)
    dm.prepare_data()
    dm.setup("fit")
    if classic:
        train_set, val_set = classic_sets(package, dm)
        workers = datamodule.default_num_workers()
        kwargs = {
            "batch_size": dm.batch_size,
            "num_workers": workers,
            "persistent_workers": workers > 0,
            "pin_memory": device.type == "cuda",
        }
        train_loader = DataLoader(train_set, shuffle=True, **kwargs)
        val_loader = DataLoader(val_set, **kwargs)

        def prepare(batch: Any, training: bool) -> tuple[Tensor, Tensor]:
            return batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)
    else:
        train_loader, val_loader = dm.train_dataloader(), dm.val_dataloader()

        def prepare(batch: Any, training: bool) -> tuple[Tensor, Tensor]:
            images, labels = batch[0].to(device), batch[1].to(device)
            return dm.normalise(dm.augment(images) if training else images), labels

    per_epoch = min(len(train_loader), limit or len(train_loader))
    optimizer = torch.optim.AdamW(network.parameters())
    scheduler = schedules.warmup_cosine(optimizer, epochs * per_epoch, 0.05)
    loss_fn = model.loss  # the model's own (label smoothing included)
    epochs_timed, losses, val_losses = [], [], []
    for _ in range(epochs):
        start = sync(device)
        losses.append(
            train_one_epoch(
                network, train_loader, prepare, optimizer, scheduler, loss_fn, per_epoch
            )
        )
        trained = sync(device)
        val_losses.append(evaluate(network, val_loader, prepare, loss_fn, limit))
        epochs_timed.append({"total": sync(device) - start, "steps": trained - start})
    result = {"epochs": epochs_timed, "losses": losses, "val_losses": val_losses}
    if test:
        result["test_acc"] = test_accuracy(network, dm.test_dataloader(), prepare)
    return result


def test_accuracy(network: nn.Module, loader: Iterable, prepare: Callable) -> float:
    """The share of test images classified correctly."""
    network.eval()
    correct, count = 0, 0
    with torch.no_grad():
        for batch in loader:
            x, y = prepare(batch, training=False)
            correct += int((network(x).argmax(1) == y).sum())
            count += len(y)
    return correct / count


def train_one_epoch(
    network: nn.Module,
    loader: Iterable,
    prepare: Callable,
    optimizer: Any,
    scheduler: Any,
    loss_fn: nn.Module,
    steps: int,
) -> float:
    network.train()
    total = None
    for step, batch in enumerate(loader):
        if step == steps:
            break
        x, y = prepare(batch, training=True)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(network(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        total = loss.detach() if total is None else total + loss.detach()
    return float(total) / steps


def evaluate(
    network: nn.Module, loader: Iterable, prepare: Callable, loss_fn: nn.Module, limit: int | None
) -> float:
    network.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for step, batch in enumerate(loader):
            if limit is not None and step == limit:
                break
            x, y = prepare(batch, training=False)
            total = total + loss_fn(network(x), y) * len(y)
            count += len(y)
    return float(total) / count


def sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def compare(options: argparse.Namespace) -> dict[str, Any]:
    """Trainer (as configured; without the bar, with the paced bar or Lightning's Rich bar, at
    other logging intervals) against the plain loop on the classic per-image path and on the
    project's data path."""
    device = torch.device("cuda" if options.accelerator == "gpu" else "cpu")
    limits = (
        []
        if options.limit is None
        else [
            "--trainer.limit_train_batches",
            str(options.limit),
            "--trainer.limit_val_batches",
            str(options.limit),
        ]
    )
    base = [
        "--max_epochs",
        str(options.epochs),
        "--accelerator",
        options.accelerator,
        "--devices",
        "1",
        "--trainer.enable_model_summary",
        "false",
        *options.data_args,
        *limits,
    ]
    trainer_variants = {
        "trainer": [],
        "trainer_no_progress_bar": ["--trainer.enable_progress_bar", "false"],
        "trainer_paced_bar": ["--trainer.callbacks+=proj.kit.callbacks.PacedProgressBar"],
        "trainer_rich_bar": ["--trainer.callbacks+=lightning.pytorch.callbacks.RichProgressBar"],
        "trainer_log_every_step": ["--trainer.log_every_n_steps", "1"],
        "trainer_log_never": ["--trainer.log_every_n_steps", "1000000"],
    }
    if not options.overhead_variants:
        trainer_variants = {"trainer": []}
    data_kwargs = data_kwargs_of(options.data_args)
    sides: dict[str, Callable[[], dict[str, Any]]] = {
        name: partial(trainer_side, options.package, [*base, *extra], device)
        for name, extra in trainer_variants.items()
    }
    for name, classic in (("plain_classic", True), ("plain_fast_data", False)):
        sides[name] = partial(
            plain_side, options.package, data_kwargs, options.epochs, options.limit, device, classic
        )
    # The process's first fit pays one-off costs (imports, allocator, caches): one fit of
    # each kind runs untimed first. Each round then starts one side later than the previous,
    # so no side always runs first after the plain loops' worker processes.
    sides["trainer"]()
    sides["plain_fast_data"]()
    names = list(sides)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for round_index in range(options.rounds):
        start = round_index % len(names)
        for name in names[start:] + names[:start]:
            results[name].append(sides[name]())
    return results


def accuracy(options: argparse.Namespace) -> dict[str, Any]:
    """The default run (`python train.py`: fit for the default epochs, test the best
    checkpoint) once per seed, and the plain loop with the same network, optimizer, schedule
    and data for as many epochs: test accuracy and seconds per epoch. For digits, an SVM
    (`SVC(gamma=0.001)` on the raw pixels) on the same training split, scored on the same
    test split."""
    device = torch.device("cuda" if options.accelerator == "gpu" else "cpu")
    cli = importlib.import_module(f"{options.package}.kit.cli")
    limits = [] if options.limit is None else [
        "--trainer.limit_train_batches", str(options.limit),
        "--trainer.limit_val_batches", str(options.limit),
    ]  # fmt: skip
    default_epochs = yaml.safe_load(cli.project_defaults().read_text())["trainer"]["max_epochs"]
    epochs = options.epochs if options.limit is not None else default_epochs
    results: dict[str, Any] = {"epochs": epochs, "runs": []}
    for seed in options.seeds:
        # The data seed draws the split (digits: train/val/test, otherwise train/val); the
        # training seed stays the default 42, so data seed 0 is exactly `python train.py`.
        args = ["--data.seed", str(seed), *options.data_args]
        args += ["--accelerator", options.accelerator, "--devices", "1"]
        args += ["--max_epochs", str(epochs)]
        clock = Clock(device)
        importlib.import_module(f"{options.package}.kit.runs").quiet_known_noise()
        built = cli.build_cli([*args, *limits], callbacks=[clock])
        built.trainer.fit(built.model, datamodule=built.datamodule)
        tested = built.trainer.test(built.model, datamodule=built.datamodule, ckpt_path="best")
        run = {"data_seed": seed, "test_acc": tested[0]["test/acc"], "epochs": clock.epochs}
        data_kwargs = {**data_kwargs_of(options.data_args), "seed": seed}
        plain = plain_side(options.package, data_kwargs, epochs, options.limit, device, False, True)
        run["plain"] = {"test_acc": plain["test_acc"], "epochs": plain["epochs"]}
        if options.package_dataset == "digits":
            run["svc_test_acc"] = svc_accuracy(built.datamodule)
        results["runs"].append(run)
    return results


def svc_accuracy(dm: Any) -> float:
    """scikit-learn's classic digits baseline, trained and scored on the data module's split."""
    from sklearn.svm import SVC

    def arrays(dataset: Dataset) -> tuple[np.ndarray, np.ndarray]:
        images, labels = zip(*(dataset[i] for i in range(len(dataset))), strict=True)
        return np.stack([image.flatten().numpy() for image in images]), np.array(labels)

    return float(SVC(gamma=0.001).fit(*arrays(dm.train_set)).score(*arrays(dm.test_set)))


def data_kwargs_of(data_args: list[str]) -> dict[str, Any]:
    pairs = zip(data_args[::2], data_args[1::2], strict=True)
    return {key.removeprefix("--data."): int(v) if v.isdigit() else v for key, v in pairs}


def throughput(options: argparse.Namespace) -> dict[str, Any]:
    """Training samples per second out of the loader, augmented and normalised as the
    model gets them, at num_workers 0 and the default; the classic path beside it."""
    data = importlib.import_module(f"{options.package}.data")
    datamodule = importlib.import_module(f"{options.package}.kit.datamodule")
    device = torch.device("cuda" if options.accelerator == "gpu" else "cpu")
    results: dict[str, list[float]] = {}
    workers_options = sorted({0, datamodule.default_num_workers()})
    for _ in range(options.rounds):
        for workers in workers_options:
            dm = data.DataModule(**{**data_kwargs_of(options.data_args), "num_workers": workers})
            dm.prepare_data()
            dm.setup("fit")
            dm.trainer = Trainer(accelerator=options.accelerator, devices=1, logger=False)
            dm.trainer.training = True
            loader = dm.train_dataloader()

            def through_hook(batch: Any, dm: Any = dm) -> Any:
                moved = (batch[0].to(device), batch[1].to(device))
                return dm.on_after_batch_transfer(moved, 0)

            results.setdefault(f"workers={workers}", []).append(
                samples_per_second(loader, through_hook, options.limit, device)
            )
            if isinstance(dm, datamodule.InMemoryDataModule):
                classic, _ = classic_sets(options.package, dm)
                loader = DataLoader(
                    classic,
                    batch_size=dm.batch_size,
                    shuffle=True,
                    num_workers=workers,
                    persistent_workers=workers > 0,
                )
                results.setdefault(f"classic workers={workers}", []).append(
                    samples_per_second(
                        loader, lambda b: (b[0].to(device), b[1]), options.limit, device
                    )
                )
    return results


def paths(options: argparse.Namespace) -> dict[str, Any]:
    """The image folder's three data paths over one folder: the files themselves, the shards
    convert.py makes of them on local disk, and those shards through an S3-compatible server
    on loopback (the library tests' s3_server.py, which bench.py copies into
    the render's tests/; its own process). Per path and round: the time from
    building the data module to its first training batch (default workers, a cold S3 cache),
    then training samples per second out of the loader. Before them: the folder module's
    start-up, first (every image decoded) and later (the check remembered), and the
    conversion."""
    import boto3
    from s3_server import s3_server

    data = importlib.import_module(f"{options.package}.data")
    shards = importlib.import_module(f"{options.package}.shards")
    kwargs = data_kwargs_of(options.data_args)
    results: dict[str, list[float]] = {}

    def timed(key: str, work: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        done = work()
        results.setdefault(key, []).append(time.perf_counter() - start)
        return done

    os.environ["XDG_CACHE_HOME"] = str(Path("cache").resolve())  # no check remembered yet
    timed("folder start-up, first (decodes every image)", lambda: data.DataModule(**kwargs))
    for _ in range(options.rounds):
        timed("folder start-up, later (lists the files)", lambda: data.DataModule(**kwargs))
    local = Path("shards").resolve()
    size = kwargs.get("image_size", 64)
    timed("convert to local shards", lambda: shards.convert(kwargs["root"], str(local), size))
    with s3_server(Path(".")) as variables:
        os.environ.update(variables)
        client = boto3.client("s3")
        client.create_bucket(Bucket="bench")
        for path in local.rglob("*"):
            if path.is_file() and ".checkpoints" not in path.parts:
                client.upload_file(str(path), "bench", f"shards/{path.relative_to(local)}")
        batch = {"batch_size": kwargs.get("batch_size", 32)}
        sides = {
            "folder": lambda: data.DataModule(**kwargs),
            "local shards": lambda: shards.ShardsDataModule(str(local), **batch),
            "S3 shards": lambda: shards.ShardsDataModule(
                "s3://bench/shards", cache_dir=Path(tempfile.mkdtemp(dir=".")), **batch
            ),
        }
        for make in sides.values():  # untimed: one-off costs (the workers' fork server)
            next(iter(make_loaded(make)))
        for _ in range(options.rounds):
            for name, make in sides.items():
                start = time.perf_counter()
                batches = iter(make_loaded(make))
                next(batches)
                results.setdefault(f"{name}: time to first batch", []).append(
                    time.perf_counter() - start
                )
                start, count = time.perf_counter(), 0
                for step, (images, _) in enumerate(batches):
                    if options.limit is not None and step == options.limit:
                        break
                    count += len(images)
                results.setdefault(f"{name}: samples/s", []).append(
                    count / (time.perf_counter() - start)
                )
                del batches  # its loader workers end before the next side starts
    return results


def make_loaded(make: Callable[[], Any]) -> DataLoader:
    dm = make()
    dm.setup("fit")
    return dm.train_dataloader()


def samples_per_second(
    loader: DataLoader, finish: Callable, limit: int | None, device: torch.device
) -> float:
    """Samples per second over one pass, after the first batch (which starts the workers)."""
    batches = iter(loader)
    finish(next(batches))
    start, count = sync(device), 0
    for step, batch in enumerate(batches):
        if limit is not None and step == limit:
            break
        x, _ = finish(batch)
        count += len(x)
    return count / (sync(device) - start)


class CallCount(Callback):
    """Python function calls (cProfile's count) from each training batch's start to its end,
    after the first epoch: the step, its hooks, logging and the bar. A count, not a time:
    it does not move with the load of a shared machine."""

    def __init__(self) -> None:
        self.profile = cProfile.Profile()
        self.steps = 0

    def on_train_batch_start(self, trainer: Trainer, *_: Any) -> None:
        if trainer.current_epoch > 0:
            self.profile.enable()

    def on_train_batch_end(self, trainer: Trainer, *_: Any) -> None:
        if trainer.current_epoch > 0:
            self.profile.disable()
            self.steps += 1


def calls(options: argparse.Namespace) -> dict[str, float]:
    """Python calls per training step: the project's Trainer as train.py builds it, and the
    plain loop's step (zero_grad, forward, loss, backward, AdamW, the schedule) on the same
    network and batches."""
    cli = importlib.import_module(f"{options.package}.kit.cli")
    counted = CallCount()
    args = ["--max_epochs", str(options.epochs), "--accelerator", "cpu", "--devices", "1"]
    args += ["--trainer.enable_model_summary", "false", *options.data_args]
    args += [] if options.limit is None else ["--trainer.limit_train_batches", str(options.limit)]
    built = cli.build_cli(args, callbacks=[counted])
    built.trainer.fit(built.model, datamodule=built.datamodule)
    trainer_calls = pstats.Stats(counted.profile).total_calls / counted.steps
    model = cli.build_model(args)
    network, loss_fn = model.backbone, model.loss
    optimizer = torch.optim.AdamW(network.parameters())
    scheduler = importlib.import_module(f"{options.package}.kit.schedules").warmup_cosine(
        optimizer, 100, 0.05
    )
    dm = built.datamodule
    batches = [(dm.normalise(dm.augment(x)), y) for x, y in list(dm.train_dataloader())[:5]]
    profile = cProfile.Profile()
    for step, (x, y) in enumerate(batches * 2):
        if step == len(batches):  # the first pass is the warm-up
            profile.enable()
        optimizer.zero_grad(set_to_none=True)
        loss_fn(network(x), y).backward()
        optimizer.step()
        scheduler.step()
    profile.disable()
    plain_calls = pstats.Stats(profile).total_calls / len(batches)
    return {"trainer": trainer_calls, "plain": plain_calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("question", choices=["compare", "throughput", "accuracy", "paths", "calls"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="accuracy: data seeds")
    parser.add_argument("--package-dataset", default="", help="accuracy: the render's dataset")
    parser.add_argument("--package", required=True)
    parser.add_argument("--data-args", default="[]", type=json.loads)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None, help="batches per epoch (all: None)")
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--overhead-variants",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compare: also fit without the bar, with the paced bar or Lightning's Rich bar and at "
        "other logging intervals",
    )
    options = parser.parse_args()
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    # The stand-in CIFAR-10 files cannot match the official checksums; the tests trust them too.
    trust = getattr(importlib.import_module("fake_data"), "trust_local_files", None)
    if trust is not None:
        trust()
    # As the project's entry scripts do: the library builds the project's model class.
    project = importlib.import_module(f"{options.package}.project").project
    importlib.import_module(f"{options.package}.kit.project").use(project)
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)  # run folders and checkpoints of the Trainer go there
        questions = {
            "compare": compare, "throughput": throughput, "accuracy": accuracy, "paths": paths,
            "calls": calls,
        }  # fmt: skip
        result = questions[options.question](options)
    options.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
