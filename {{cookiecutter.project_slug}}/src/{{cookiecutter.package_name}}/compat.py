"""The one place that touches private parts of libraries; tests/test_compat.py checks them."""

import csv
from datetime import timedelta

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.strategies import Strategy


def set_collective_timeout(strategy: Strategy, seconds: float) -> bool:
    """Make the process group of `strategy` give up on a collective after `seconds`.

    Lightning's DDP and FSDP strategies take a `timeout` argument but keep it private, and
    a strategy named on the command line (`--strategy ddp`) is built with torch's default of
    30 minutes. Returns False for a strategy without a process group of its own.
    """
    if not hasattr(strategy, "_timeout"):
        return False
    strategy._timeout = timedelta(seconds=seconds)
    return True


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
