"""Loaded by every Python process a user-path test starts (this folder is on PYTHONPATH).

With STACKS_DIR=<folder> and STACKS_SIGNAL=<name>, each process writes its command line to a
file of its own in that folder now, and the Python stacks of all its threads whenever it
receives that signal. A test that finds its command stalled sends the signal to the command's
whole process group, so every rank, launcher and loader worker shows where it was waiting.

The stacks are written on demand, not after a fixed time: a slow machine makes a command
slower, not hung, and the test alone can tell the two apart (by its output, which stopped).
faulthandler writes them from a C signal handler, so a process blocked in C (a collective, a
lock, a read) answers too; a Python-level handler would wait for the blocked call to return.
The test's signal is one that neither the project nor its libraries handle: SIGUSR1 means
"save and stop" to the project (and requeue to Lightning under SLURM), SIGTERM and SIGINT
stop the run.
"""

import faulthandler
import os
import signal
from pathlib import Path


def _write_stacks_on_signal(forked: bool = False) -> None:
    command = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    rank = ", ".join(
        f"{key}={os.environ[key]}"
        for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID")
        if key in os.environ
    )
    file = (Path(os.environ["STACKS_DIR"]) / f"{os.getpid()}.txt").open("w")
    origin = f", forked from {os.getppid()}" if forked else ""
    file.write(f"process {os.getpid()} ({rank or 'no rank set yet'}){origin}: {command}\n")
    file.flush()
    # Not chained: the handler before this one is the default action, which ends the process.
    faulthandler.register(
        signal.Signals[os.environ["STACKS_SIGNAL"]], file=file, all_threads=True, chain=False
    )


if os.environ.get("STACKS_DIR") and os.environ.get("STACKS_SIGNAL"):
    _write_stacks_on_signal()
    # A forked child (a loader worker from the fork server, a fork-started process) inherits
    # the handler but would write into its parent's file under its parent's name: it gets a
    # file of its own. Processes started by exec load this module again instead.
    os.register_at_fork(after_in_child=lambda: _write_stacks_on_signal(forked=True))
