"""The one place that touches private parts of libraries; tests/test_compat.py checks them."""

from datetime import timedelta

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
