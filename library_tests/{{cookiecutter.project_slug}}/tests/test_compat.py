"""The private parts of libraries that compat.py touches are still where it expects them."""
{% if cookiecutter.logger != "tensorboard" %}
import csv
{%- endif %}
import inspect
{%- if cookiecutter.logger != "tensorboard" %}
import warnings
{%- endif %}
from argparse import SUPPRESS
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning import LightningModule, Trainer
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import EMAWeightAveraging, TQDMProgressBar
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.strategies import ddp as ddp_module
from torchmetrics import Metric
from torchmetrics.aggregation import CatMetric, MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.wrappers import ClasswiseWrapper

from {{ cookiecutter.package_name }}.kit.cli import trainer_flag_type
from {{ cookiecutter.package_name }}.kit.compat import (
{%- if cookiecutter.logger != "tensorboard" %}
    AppendingCSVLogger,
{%- endif %}
    PacingHook,
    add_metric_states,
    average_for_the_test,
    destroy_process_group,
    evaluation_loaders,
    logs_this_step,
    metric_states,
    module_holds_for_this_epoch,
    module_logs_this_step,
    running_epoch_metrics,
    scheduler_sequence,
    set_collective_timeout,
{%- if cookiecutter.logger == "tensorboard" %}
    tensorboard_file_writer,
{%- endif %}
{%- if cookiecutter.sweep == "yes" %}
    trial_id,
{%- endif %}
)


def test_the_collective_timeout_reaches_the_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    strategy = DDPStrategy(
        accelerator=CPUAccelerator(),
        parallel_devices=[torch.device("cpu")],
        cluster_environment=LightningEnvironment(),
    )
    assert set_collective_timeout(strategy, 12.5)
    given = {}
    connect = lambda *_, **kwargs: given.update(kwargs)  # noqa: E731
    monkeypatch.setattr(ddp_module, "_init_dist_connection", connect)
    strategy.setup_distributed()
    assert given["timeout"] == timedelta(seconds=12.5)


def test_a_single_device_has_no_collective_timeout() -> None:
    assert not set_collective_timeout(SingleDeviceStrategy(torch.device("cpu")), 12.5)


def test_the_averaged_copy_that_fit_built_is_dropped_before_a_test() -> None:
    """The attribute whose copy makes Lightning's EMA load a checkpoint's current weights."""
    ema = EMAWeightAveraging(decay=0.9)
    assert "_average_model" in vars(ema)  # Lightning's name for it, set as the callback is made
    ema._average_model = torch.optim.swa_utils.AveragedModel(torch.nn.Linear(2, 2))
    average_for_the_test(SimpleNamespace(callbacks=[ema]))
    assert ema._average_model is None


def test_lightning_picks_ddp_for_several_devices_itself() -> None:
    """`auto` with several devices: the strategy train.py gives the timeout to, once built."""
    trainer = Trainer(accelerator="cpu", devices=2, logger=False, enable_checkpointing=False)
    assert type(trainer.strategy) is DDPStrategy
    assert set_collective_timeout(trainer.strategy, 12.5)


{% if cookiecutter.logger != "tensorboard" %}def test_the_csv_logger_adds_to_the_metrics_of_a_run_folder(tmp_path: Path) -> None:
    """A resume or an evaluation logs into a run folder that has a metrics.csv already."""
    first = AppendingCSVLogger(tmp_path, name="default", version=0)
    first.log_metrics({"train/loss": 1.5}, step=0)
    first.save()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Lightning's writer warns, then deletes the file
        again = AppendingCSVLogger(tmp_path, name="default", version=0)
        again.log_metrics({"train/loss": 1.25}, step=1)
        again.log_metrics({"test/acc": 0.5}, step=2)  # a column the file does not have yet
        again.save()
    with open(tmp_path / "default" / "version_0" / "metrics.csv", newline="") as file:
        rows = [(row["step"], row["train/loss"], row["test/acc"]) for row in csv.DictReader(file)]
    assert rows == [("0", "1.5", ""), ("1", "1.25", ""), ("2", "", "0.5")]


{% endif %}REFUSED = "refused"


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("accelerator", "cpu", "cpu"),
        ("devices", "2", "2"),
        ("devices", "[0, 1]", [0, 1]),
        ("devices", "auto", "auto"),
        ("num_nodes", "2", 2),
        ("num_nodes", "two", REFUSED),
        ("precision", "bf16-mixed", "bf16-mixed"),
        ("precision", "16", 16),
        ("precision", "17", REFUSED),
        ("strategy", "ddp", "ddp"),
        ("max_epochs", "3", 3),
        ("max_epochs", "null", None),
        ("max_epochs", "3.5", REFUSED),
    ],
)
def test_short_flags_take_the_values_of_the_trainer_arguments(
    flag: str, value: str, expected: object
) -> None:
    parser = LightningArgumentParser(exit_on_error=False)
    parser.add_lightning_class_args(Trainer, "trainer")
    short = trainer_flag_type(flag)
    parser.add_argument(f"--{flag}", dest=f"trainer.{flag}", type=short, default=SUPPRESS)

    def parsed(*args: str) -> object:
        try:
            return parser.parse_args(list(args)).trainer[flag]
        except Exception:
            return REFUSED

    assert parsed(f"--{flag}", value) == parsed(f"--trainer.{flag}", value) == expected


def test_the_process_group_goes_with_its_gloo_backend(tmp_path: Path) -> None:
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    torch.distributed.barrier()
    destroy_process_group()
    assert not torch.distributed.is_initialized()


def test_the_bar_asks_before_each_redraw() -> None:
    asked = []

    class Recording(PacingHook):
        def may_redraw(self, current: int, total: int) -> bool:
            asked.append((current, total))
            return False

    bar = Recording(refresh_rate=1)
    assert not bar._should_update(3, 10)
    assert asked == [(3, 10)]
    # Lightning asks it when an evaluation batch ends (a training batch's end is PacingHook's).
    assert "self._should_update(" in inspect.getsource(TQDMProgressBar.on_validation_batch_end)


def test_lightning_ends_a_training_batch_as_pacing_hook_does_drawing_twice() -> None:
    # PacingHook.on_train_batch_end replaces Lightning's, drawing once: anything Lightning's
    # did beyond the count and the metrics would be lost.
    source = inspect.getsource(TQDMProgressBar.on_train_batch_end)
    body = [line.strip() for line in source.split(") -> None:", 1)[1].strip().splitlines()]
    assert body == [
        "n = batch_idx + 1",
        "if self.train_progress_bar is not None and "
        "self._should_update(n, self.train_progress_bar.total):",
        "_update_n(self.train_progress_bar, n)",
        "self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))",
    ]


def test_lightning_starts_a_training_epoch_as_pacing_hook_does_drawing_twice() -> None:
    # PacingHook.on_train_epoch_start replaces Lightning's, drawing once.
    source = inspect.getsource(TQDMProgressBar.on_train_epoch_start)
    body = [line.strip() for line in source.split(") -> None:", 1)[1].strip().splitlines()]
    assert body == [
        "if self._leave:",
        "self.train_progress_bar = self.init_train_tqdm()",
        "total = convert_inf(self.total_train_batches)",
        "self.train_progress_bar.reset()",
        "self.train_progress_bar.total = total",
        "self.train_progress_bar.initial = 0",
        'self.train_progress_bar.set_description(f"Epoch {trainer.current_epoch}")',
    ]


def test_a_sequential_schedule_shows_its_schedulers_and_where_each_starts() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=3)
    constant = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0)
    sequence = torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, constant], [3])
    assert scheduler_sequence(sequence) == ([warmup, constant], [3])


def test_a_step_logs_every_log_every_n_steps() -> None:
    trainer = Trainer(log_every_n_steps=3, logger=False, enable_checkpointing=False)
    trainer.training = True
    logs = []
    for stepped in range(7):  # as on_train_batch_start sees it: the steps taken before
        trainer.fit_loop.epoch_loop._batches_that_stepped = stepped
        logs.append(logs_this_step(trainer))
    assert logs == [False, False, True, False, False, True, False]
    trainer.should_stop = True  # the last step of a run logs too
    assert logs_this_step(trainer)
    trainer = Trainer(fast_dev_run=True, logger=False)  # every step of a fast_dev_run logs
    trainer.training = True
    trainer.fit_loop.epoch_loop._batches_that_stepped = 1
    assert logs_this_step(trainer)
    # A module's step run by hand, without a trainer, logs (its self.log calls do nothing).
    module = LightningModule()
    assert module_logs_this_step(module)
    module.trainer = Trainer(log_every_n_steps=3, logger=False, enable_checkpointing=False)
    module.trainer.training = True
    assert not module_logs_this_step(module)
    module.trainer.fit_loop.epoch_loop._batches_that_stepped = 2
    assert module_logs_this_step(module)
    module.trainer.validating = True  # a validation step inside the fit: it writes no logs
    assert not module_logs_this_step(module)


class Toy(LightningModule):
    """A linear layer trained by SGD: the steps are the tests' own."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def toy_run(tmp_path: Path, **kwargs: object) -> tuple[Trainer, torch.utils.data.DataLoader]:
    """A Trainer that writes nothing, and a loader of 2-batches of ones (`rows` of them)."""
    rows = kwargs.pop("rows", 2)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(rows, 2)), 2)
    trainer = Trainer(
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path, **kwargs,
    )  # fmt: skip
    return trainer, loader


class Unsized(torch.utils.data.IterableDataset):
    """Seven batches that no loader can count: a bar's total is unknown."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter([torch.ones(4, 2)] * 7)


def test_a_bar_of_unknown_length_ends_each_epoch_on_its_count(tmp_path: Path) -> None:
    ends: list[int] = []

    class Paced(PacingHook):  # paced past every step: only the epochs' starts and ends draw
        def may_redraw(self, current: int, total: int) -> bool:
            return False

        def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
            ends.append(self.train_progress_bar.n)  # the count the epoch's end draws
            super().on_train_epoch_end(trainer, pl_module)

    class Trained(Toy):
        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.layer(batch).mean()

    trainer = Trainer(
        max_epochs=2, callbacks=[Paced()], logger=False, enable_checkpointing=False,
        enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(Trained(), torch.utils.data.DataLoader(Unsized(), batch_size=None))
    assert ends == [7, 7]


def test_a_module_knows_how_many_loaders_its_evaluation_reads(tmp_path: Path) -> None:
    seen = []

    class Counts(Toy):
        def step(self, stage: str) -> torch.Tensor:
            seen.append((stage, evaluation_loaders(self)))
            return self.layer(torch.ones(1, 2)).mean()

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            return self.step("train")

        def validation_step(
            self, batch: list[torch.Tensor], batch_idx: int, dataloader_idx=0
        ) -> None:
            self.step("sanity" if self.trainer.sanity_checking else "val")

        def test_step(self, batch: list[torch.Tensor], batch_idx: int, dataloader_idx=0) -> None:
            self.step("test")

    trainer, loader = toy_run(tmp_path, max_epochs=1, num_sanity_val_steps=1)
    module = Counts()
    assert evaluation_loaders(module) == 1  # no trainer
    trainer.fit(module, loader, [loader, loader])
    trainer.validate(module, [loader, loader, loader], verbose=False)
    trainer.test(module, loader, verbose=False)
    assert sorted(set(seen)) == [("sanity", 2), ("test", 1), ("train", 1), ("val", 2), ("val", 3)]


def test_a_module_knows_what_lightning_holds_for_this_epoch(tmp_path: Path) -> None:
    """Asked before each self.log: True once a name is logged in this hook, until Lightning
    resets its results (each training epoch's end, each validation run's end)."""
    seen = []

    class Logs(Toy):
        def step(self, batch: list[torch.Tensor], stage: str) -> torch.Tensor:
            seen.append((stage, module_holds_for_this_epoch(self, [f"{stage}/x", f"{stage}/y"])))
            loss = self.layer(batch[0]).mean()
            self.log(f"{stage}/x", loss)
            if stage == "train" or not self.trainer.sanity_checking:  # y: not in the sanity run
                self.log(f"{stage}/y", loss)
            return loss

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            return self.step(batch, "train")

        def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
            self.step(batch, "val")

    trainer, loader = toy_run(tmp_path, rows=4, max_epochs=2, num_sanity_val_steps=2)
    module = Logs()
    assert not module_holds_for_this_epoch(module, ["train/x"])  # no trainer
    trainer.fit(module, loader, loader)
    epoch = [("train", False), ("train", True), ("val", False), ("val", True)]
    assert seen == [("val", False), ("val", False), *epoch, *epoch]


def test_the_running_epochs_metric_objects_are_found_until_its_last_batch(tmp_path: Path) -> None:
    seen = []

    class Means(Toy):
        def __init__(self) -> None:
            super().__init__()
            self.mean, self.value = MeanMetric(), MeanMetric()

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            loss = self.layer(batch[0]).mean()
            self.mean.update(loss)
            self.log("train/mean", self.mean, on_step=False, on_epoch=True)
            self.log("train/tensor", loss)  # a tensor, not an object: not among them
            return loss

        def on_train_batch_end(self, *_: object) -> None:
            seen.append(running_epoch_metrics(self.trainer))

    trainer, loader = toy_run(tmp_path, rows=6, max_epochs=1)
    module = Means()
    trainer.fit(module, loader)
    assert seen == [{"training_step.train/mean": module.mean}] * 2 + [{}]  # 3 batches


def same(a: torch.Tensor | dict, b: torch.Tensor | dict) -> bool:
    """Equal to the last bit: two tensors, or two dicts of them (a wrapper's value)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
    return torch.equal(a, b)


def test_metric_states_read_from_part_of_an_epoch_add_up_as_if_updated_throughout() -> None:
    """Sums, lists, maxima; also the metric inside a wrapper. A reduction that cannot
    combine (a mean) leaves the metric unchanged."""
    first, second = torch.tensor([0.1, 0.7, 0.2]), torch.tensor([0.9, 0.4])
    logits = torch.nn.functional.one_hot(torch.tensor([0, 2, 2, 2, 1]), 3).float()
    labels = torch.tensor([0, 2, 1, 2, 0])
    makers = {
        "mean": (MeanMetric, [(first,), (second,)]),
        "cat": (CatMetric, [(first,), (second,)]),
        "max": (MaxMetric, [(second,), (first,)]),
        "accuracy": (
            lambda: ClasswiseWrapper(MulticlassAccuracy(3, average=None)),
            [(logits[:3], labels[:3]), (logits[3:], labels[3:])],
        ),
    }
    for name, (make, (one, two)) in makers.items():
        whole, before, after = make(), make(), make()
        whole.update(*one)
        whole.update(*two)
        before.update(*one)
        after.update(*two)
        alone = make()
        alone.update(*two)
        assert not same(alone.compute(), whole.compute()), name  # the data tells them apart
        assert add_metric_states(after, metric_states(before)), name
        assert same(after.compute(), whole.compute()), name

    class Averaged(Metric):  # a mean of means: nothing says how to take in more updates
        def __init__(self) -> None:
            super().__init__()
            self.add_state("average", torch.tensor(0.0), dist_reduce_fx="mean")

        def update(self, value: torch.Tensor) -> None:
            self.average = value.mean()

        def compute(self) -> torch.Tensor:
            return self.average

    before, after = Averaged(), Averaged()
    before.update(first)
    after.update(second)
    assert not add_metric_states(after, metric_states(before))
    assert after.compute() == second.mean()
{%- if cookiecutter.logger == "tensorboard" %}


def test_a_closed_tensorboard_writer_reopens_its_event_file_writer(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import scalar

    writer = SummaryWriter(str(tmp_path))
    writer.add_scalar("before", 1.0, 0)
    writer.close()  # as a test's end closes the logger's
    reopened = tensorboard_file_writer(writer)
    reopened.add_summary(scalar("after", 2.0), 3)
    writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["after", "before"]
    assert [(e.step, e.value) for e in events.Scalars("after")] == [(3, 2.0)]
{%- endif %}
{%- if cookiecutter.sweep == "yes" %}


def test_a_trial_is_found_again_by_its_id() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.InMemoryStorage()
    optuna.create_study(storage=storage, study_name="earlier").ask()
    study = optuna.create_study(storage=storage, study_name="this")
    trial = study.ask()  # number 0 in this study; the storage's id 0 is the earlier study's
    value = trial.suggest_float("x", 0, 1)
    again = optuna.trial.Trial(study, trial_id(trial))
    assert again.number == trial.number == 0
    assert again.suggest_float("x", 0, 1) == value  # the same trial, as stored
{%- endif %}
