"""The one place that touches private parts of libraries; the library's tests check them."""

import csv
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar, WeightAveraging
from lightning.pytorch.callbacks.progress.tqdm_progress import convert_inf
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.strategies import Strategy
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat, dim_zero_max, dim_zero_min, dim_zero_sum


def set_collective_timeout(strategy: Strategy, seconds: float) -> bool:
    """Make the process group of `strategy`, already built, give up on a collective after
    `seconds`.

    For a strategy that Lightning picks itself: `--strategy auto` (the default) with several
    devices or nodes gives DDP, built from its registry's defaults (torch's 30 minutes), and
    no public setting reaches its timeout. A strategy the config names, by name or class, gets
    `timeout` as an argument instead (TrainCLI.before_instantiate_classes). The DDP and FSDP
    strategies keep the argument in a private attribute. Returns False for a strategy without
    a process group of its own.
    """
    if not hasattr(strategy, "_timeout"):
        return False
    strategy._timeout = timedelta(seconds=seconds)
    return True


def average_for_the_test(trainer: Trainer) -> None:
    """Make a test after fit, in the same Trainer, use the averaged weights a checkpoint holds.

    Lightning's WeightAveraging (EMA), loading a checkpoint while the averaged copy it built
    for fit exists, puts the checkpoint's current (not averaged) weights back into the model,
    as a resumed fit needs: the final test would score those. A new process testing the same
    checkpoint (evaluate.py) has no copy and keeps the average; dropping the copy after fit
    (a private attribute) does the same here.
    """
    for callback in trainer.callbacks:
        if isinstance(callback, WeightAveraging):
            callback._average_model = None


class AppendingWriter(ExperimentWriter):
    """Lightning's metrics.csv writer, keeping the rows and columns of an existing file.

    Lightning's own writer warns and deletes the file when it opens a folder that has one.
    """

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                self.metrics_keys = next(csv.reader(file), [])


class AppendingCSVLogger(CSVLogger):
    """CSVLogger that adds to the run folder's metrics.csv (a resume, an evaluation)."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AppendingWriter(log_dir=self.log_dir)
        return self._experiment


def destroy_process_group() -> None:
    """destroy_process_group, without the gloo deadlock of torch before 2.8.

    There, the process group's destructor holds the GIL while it joins gloo's worker threads,
    and a worker freeing the tensors of a finished collective (the last broadcast) waits for
    the GIL: both wait forever. The gloo backend's own Python object releases the GIL when it
    is destroyed, so it is held while the group goes and let go last.
    """
    world = torch.distributed.group.WORLD
    cpu = torch.device("cpu")
    gloo = world._get_backend(cpu) if "gloo" in torch.distributed.get_backend(world) else None
    del world
    torch.distributed.destroy_process_group()
    del gloo  # the last reference: gloo's threads stop here, with the GIL released


def logs_this_step(trainer: Any) -> bool:
    """Whether the training step under way writes to the loggers (every `log_every_n_steps`,
    when the run stops, and every step of a fast_dev_run); asked from `on_train_batch_start`
    to `on_train_batch_end`.

    Lightning keeps it in a private attribute of the trainer, as its own LR monitor reads it.
    """
    return trainer._logger_connector.should_update_logs or bool(trainer.fast_dev_run)


def module_logs_this_step(module: Any) -> bool:
    """`logs_this_step` of the trainer running a LightningModule's training step (False in a
    validation or test step); True when none does (a step called by hand, whose `self.log`
    calls warn and do nothing)."""
    trainer = module._trainer  # `module.trainer` raises when there is none
    return trainer is None or (trainer.training and logs_this_step(trainer))


def evaluation_loaders(module: Any) -> int:
    """How many loaders the running validation or test reads; 1 while training, or without a
    trainer (a step called by hand)."""
    trainer = module._trainer  # `module.trainer` raises when there is none
    if trainer is None:
        return 1
    if trainer.sanity_checking:
        return len(trainer.num_sanity_val_batches)
    if trainer.validating:
        return len(trainer.num_val_batches)
    return len(trainer.num_test_batches) if trainer.testing else 1


def module_holds_for_this_epoch(module: Any, names: Iterable[str]) -> bool:
    """Whether every one of these names was logged in the running hook since Lightning last
    reset its results (each training epoch's end, each validation or test run's end); False
    without a trainer. A metric object logged once by then is computed at the epoch's end as
    if it had been logged at every step.

    Lightning keeps logged values in a private `_ResultCollection` under "<hook>.<name>" keys.
    """
    trainer = module._trainer
    results = None if trainer is None else trainer._results
    if results is None:
        return False
    hook = module._current_fx_name
    return all(
        (result := results.get(f"{hook}.{name}")) is not None and not result.has_reset
        for name in names
    )


def running_epoch_metrics(trainer: Trainer) -> dict[str, Metric]:
    """The metric objects logged in the training epoch under way, by Lightning's key for each
    ("<hook>.<name>"); empty once the epoch's last batch has run (they are computed and reset
    when the epoch ends).

    Lightning's training loop keeps them in a private `_ResultCollection`.
    """
    loop = trainer.fit_loop.epoch_loop
    progress = loop.batch_progress
    if progress.is_last_batch or progress.current.ready == trainer.num_training_batches:
        return {}
    return {
        key: result.value
        for key, result in loop._results.items()
        if not result.is_tensor and not result.has_reset
    }


# How a metric's state of each reduction takes in the state of other updates: torchmetrics
# keeps the reduction of each state (the one that gathers processes) in private attributes.
COMBINE = {
    dim_zero_sum: torch.add,
    dim_zero_max: torch.maximum,
    dim_zero_min: torch.minimum,
}


def metric_states(metric: Metric) -> dict[str, dict[str, Any]]:
    """The states of `metric` and of the metrics inside it (a wrapper's), by module path."""
    return {
        path: {name: getattr(inner, name) for name in inner._defaults}
        for path, inner in metric.named_modules()
        if isinstance(inner, Metric) and inner._defaults
    }


def add_metric_states(metric: Metric, earlier: dict[str, dict[str, Any]]) -> bool:
    """Add states that `metric_states` read from an earlier part of the same epoch to
    `metric`'s, as if the updates had continued; False, changing nothing, where a state's
    reduction says nothing about how (a mean of means, a custom function)."""
    inner = dict(metric.named_modules())
    combined = {}
    for path, states in earlier.items():
        target = inner.get(path)
        if not isinstance(target, Metric) or set(states) != set(target._defaults):
            return False
        for name, value in states.items():
            current, reduction = getattr(target, name), target._reductions[name]
            if isinstance(current, list) and reduction in (dim_zero_cat, None):
                combined[path, name] = [*(item.to(target.device) for item in value), *current]
            elif reduction in COMBINE:
                combined[path, name] = COMBINE[reduction](value.to(current), current)
            else:
                return False
    for (path, name), value in combined.items():
        setattr(inner[path], name, value)
    return True


class PacingHook(TQDMProgressBar):
    """Lightning's TQDM bar with a public `may_redraw(current, total)` asked before a redraw,
    drawn once when a training batch ends.

    Lightning decides redraws in a private method, `_should_update`. Its own bar draws the
    line twice when a training batch ends, the new count and then the metrics: each a full
    format of the line, each appended to the output when it is a file. Here the metrics are
    set first, then the line is drawn once. The count is kept current between drawings, so
    the drawing at an epoch's end shows it when the bar's total is unknown (an iterable
    dataset), where the last step is not known to be the last. As an epoch starts, Lightning's
    bar draws the emptied line under the last epoch's name, then again under the new one;
    here it is drawn once, under the new name.
    """

    def _should_update(self, current: int, total: int) -> bool:
        return super()._should_update(current, total) and self.may_redraw(current, total)

    def may_redraw(self, current: int, total: int) -> bool:
        return True

    def on_train_epoch_start(self, trainer: Trainer, *_: Any) -> None:
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        bar = self.train_progress_bar
        bar.total = convert_inf(self.total_train_batches)  # None: unknown (tqdm takes no inf)
        bar.initial = 0
        bar.set_description(f"Epoch {trainer.current_epoch}", refresh=False)
        bar.reset()  # n = 0, the clock restarted, one drawing

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        bar, n = self.train_progress_bar, batch_idx + 1
        if bar.disable:  # a process other than the first, or no bar
            return
        bar.n = n
        if self._should_update(n, bar.total):
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            bar.refresh()


def trial_id(trial: Any) -> int:
    """The storage's id of a study's trial: what the Trial class takes, with the study, to make
    the same trial in another process (the other ranks of a DDP trial).

    The library keeps it in a private attribute; its public `number` counts within the study.
    """
    return trial._trial_id


def tensorboard_file_writer(writer: Any) -> Any:
    """The event file writer of a TensorBoard `SummaryWriter`, reopened if it was closed.

    Its public `add_hparams` writes the metrics again, into a folder of its own; the HParams
    tab needs only the summaries, in the run's own event files, naming metrics already logged.
    """
    return writer._get_file_writer()


def scheduler_sequence(scheduler: Any) -> tuple[list[Any], list[int]]:
    """The schedulers of a SequentialLR and the steps where each after the first starts (torch
    keeps both in private attributes; they are what a resumed schedule re-plans)."""
    return scheduler._schedulers, scheduler._milestones
