"""Loaded by every Python process a user-path test starts (this folder is on PYTHONPATH).

With STACKS_AFTER=<seconds> and STACKS_DIR=<folder>, each process writes its command line
now and the Python stacks of all its threads once that many seconds have passed, so a test
that times out shows where every rank was waiting.
"""

import faulthandler
import os
from pathlib import Path

if os.environ.get("STACKS_AFTER") and os.environ.get("STACKS_DIR"):
    _command = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    _rank = ", ".join(
        f"{key}={os.environ[key]}"
        for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID")
        if key in os.environ
    )
    _file = (Path(os.environ["STACKS_DIR"]) / f"{os.getpid()}.txt").open("w")
    _file.write(f"process {os.getpid()} ({_rank or 'no rank set yet'}): {_command}\n")
    _file.flush()
    faulthandler.dump_traceback_later(float(os.environ["STACKS_AFTER"]), file=_file)
