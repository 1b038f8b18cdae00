"""Test a checkpoint with the trainer, callbacks and data of the run that wrote it.

python evaluate.py                       the best checkpoint of the newest run
python evaluate.py --ckpt_path last      or a file; any other option as for train.py
"""

import argparse
import json
import sys

from .checkpoint import load_checkpoint, resolve_checkpoint, run_config
from .cli import HELP, build_cli
from .errors import ConfigError
from .runs import quiet_known_noise


def main(args: list[str] | None = None) -> dict[str, float]:
    """Test metrics of the checkpoint, printed and written to <run>/eval_metrics.json (the
    latest evaluation) and <run>/eval_metrics-<checkpoint>.json (that checkpoint's)."""
    quiet_known_noise()
    picker = argparse.ArgumentParser(add_help=False)
    picker.add_argument("--ckpt_path", default="best")
    known, rest = picker.parse_known_args(sys.argv[1:] if args is None else args)
    if HELP & set(rest):  # the options, whether or not a run exists yet
        build_cli(rest)
    try:
        checkpoint = resolve_checkpoint(known.ckpt_path)
        load_checkpoint(checkpoint)  # a refused or damaged file stops here, in one line
        run_config(checkpoint)  # the data setup comes from the run's own config.yaml
        # build_cli puts that config first: the test sees the run's data, callbacks and folder.
        cli = build_cli([*rest, "--ckpt_path", str(checkpoint)])
    except ConfigError as error:
        sys.exit(f"error: {error}")
    trainer = cli.trainer
    results = trainer.test(
        cli.model, datamodule=cli.datamodule, ckpt_path=str(checkpoint), weights_only=True
    )
    metrics = {key: float(value) for key, value in results[0].items()}
    run = checkpoint.parent.parent
    if trainer.is_global_zero:
        text = json.dumps({"checkpoint": str(checkpoint), **metrics}, indent=2) + "\n"
        # Testing another checkpoint of the run keeps this one's figures beside it.
        for path in (run / f"eval_metrics-{checkpoint.stem}.json", run / "eval_metrics.json"):
            path.write_text(text)
        print(f"Metrics written to {path} (and {path.stem}-{checkpoint.stem}.json)")
    return metrics
