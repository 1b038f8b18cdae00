"""The training recipe: build from the command line, resume if asked, fit, test, report.

python train.py                                   fit, then test the best checkpoint
python train.py --devices 2 --max_epochs 5        short forms of --trainer.*
python train.py --config configs/model/resnet18.yaml    any --trainer.*, --model.*, --data.* key
python train.py --ckpt_path last                  resume the newest run of this experiment
python train.py --init_from <run>/checkpoints/<best>.ckpt   start from another run's weights
"""

import sys
from collections.abc import Sequence
from pathlib import Path

from lightning.pytorch import Callback
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from .checkpoint import start_from
from .cli import build_cli
from .compat import average_for_the_test, set_collective_timeout
from .errors import ConfigError
from .runs import (
    best_checkpoint,
    check_resumable,
    finish,
    log_hyperparameters,
    quiet_known_noise,
    release,
    stop_if_interrupted,
    stops_in_one_line,
    write_results,
)


def main(args: list[str] | None = None, callbacks: Sequence[Callback] = ()) -> dict[str, float]:
    """Fit, then test the best checkpoint; return the test metrics."""
    quiet_known_noise()
    try:
        cli = build_cli(args, callbacks)  # model, data and trainer; a resume's own config
        if cli.config.ckpt_path:
            check_resumable(cli.model, Path(cli.config.ckpt_path))
        elif cli.config.init_from:  # transfer learning: weights of another run or model
            rank_zero_info(start_from(cli.model, Path(cli.config.init_from)))
    except (ConfigError, MisconfigurationException) as error:
        # Lightning's own checks (e.g. a negative max_epochs) are one sentence too.
        sys.exit(f"error: {str(error).splitlines()[0]}")
    trainer, model, data = cli.trainer, cli.model, cli.datamodule
    try:
        # `auto` (the default): Lightning picks the strategy, DDP for several devices, built
        # without the timeout that a strategy the config names is given (cli.py).
        if isinstance(cli.config.trainer.strategy, str):
            set_collective_timeout(trainer.strategy, cli.config.collective_timeout)
        for logger in trainer.loggers:
            _ = logger.version  # fix the run folder now: processes started later use it too
        with stops_in_one_line(trainer, cli.config.collective_timeout):
            # Checkpoints hold tensors and plain data only (check_resumable read the resumed
            # one that way): loaded weights-only, a file runs no code, whatever torch's default.
            trainer.fit(model, datamodule=data, ckpt_path=cli.config.ckpt_path, weights_only=True)
            stop_if_interrupted(trainer)
            best = best_checkpoint(trainer)
            average_for_the_test(trainer)  # with EMA on: the average, which was validated
            results = trainer.test(
                model, datamodule=data, ckpt_path=best, verbose=False, weights_only=True
            )
            stop_if_interrupted(trainer)
        metrics = {key: float(value) for key, value in results[0].items()} if results else {}
        write_results(trainer, best, metrics, cli.config.trainer.logger)
        log_hyperparameters(trainer, cli.config, metrics)
        finish()
        return metrics
    finally:
        release(cli)
