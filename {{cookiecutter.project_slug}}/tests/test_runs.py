"""Whole runs as a user starts them (`pytest -m slow`): `python train.py` with every default on a
terminal, and a two-process DDP run into a file.

A run counts as hung when its output stops growing for STALL seconds, not when it is slow: then
every Python process of it (both ranks, the launcher) prints its stacks (faulthandler, on
SIGABRT), and the test fails with them.
"""

import contextlib
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# The longest silence of a healthy run is its start (two interpreters importing torch at once);
# 180 s leaves room for a machine many times slower than a laptop.
STALL = 180
# A run that keeps printing but never ends (a loop that retries and logs) fails too: 60 times
# what the default run takes on 2 cores.
CEILING = 20 * 60


def run(command: list[str], cwd: Path, terminal: bool) -> str:
    """Run a command on a pseudo-terminal or into a file; its output, once it ended with 0."""
    log = cwd / "output.txt"
    if terminal:
        reader, writer = pty.openpty()
    else:
        writer = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        stdin=subprocess.DEVNULL,
        stdout=writer,
        stderr=writer,
        start_new_session=True,  # its own process group: the ranks and loader workers too
    )
    os.close(writer)
    output, started = b"", time.monotonic()
    quiet_since = started
    stacks_until = None  # once the run stalled: its stacks are read until then
    try:
        while True:
            ended = process.poll() is not None  # before reading: nothing written is missed
            before = len(output)
            if terminal:
                if select.select([reader], [], [], 1)[0]:
                    try:
                        chunk = os.read(reader, 65536)
                    except OSError:  # every process holding the terminal has closed it
                        chunk = b""
                    if not chunk:
                        break
                    output += chunk
            else:
                time.sleep(1)
                output = log.read_bytes()
            now, grown = time.monotonic(), len(output) > before
            if grown:
                quiet_since = now
            if stacks_until is not None:
                if now > stacks_until:
                    break
            elif ended and not grown and (not terminal or now - quiet_since > 5):
                break  # (a process left behind may keep the terminal open)
            elif now - quiet_since > STALL or now - started > CEILING:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGABRT)  # each Python process prints stacks
                stacks_until = now + 10
    finally:
        if stacks_until is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=60)  # its output ended: it is ending
        # A stalled run's processes end as they finish writing their stacks (the terminal may
        # close before a process that does not hold it has written them): wait for them.
        while stacks_until is not None and time.monotonic() < stacks_until:
            process.poll()  # the first process, once it ended: no longer a member
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # and whatever it left behind
        process.wait()
        if terminal:
            os.close(reader)
    stalled = stacks_until is not None
    text = output.decode(errors="replace")
    assert not stalled, (
        f"{command} wrote nothing for {STALL} s (or ran {CEILING} s); its stacks:\n{text[-20000:]}"
    )
    assert process.returncode == 0, f"{command} exited with {process.returncode}:\n{text[-6000:]}"
    return text


def metrics_of(cwd: Path) -> dict[str, float]:
    (metrics,) = cwd.glob("runs/default/version_*/test_metrics.json")
    return json.loads(metrics.read_text())


def test_the_default_run_on_a_terminal(
    train_command: list[str], data_args: list[str], tmp_path: Path
) -> None:
    output = run([*train_command, *data_args], tmp_path, terminal=True)
    assert "Best checkpoint:" in output and "Test:" in output
    assert 0 <= metrics_of(tmp_path)["test/acc"] <= 1


def test_a_two_process_run_into_a_file(
    train_command: list[str], data_args: list[str], tmp_path: Path
) -> None:
    command = [*train_command, *data_args, "--devices", "2", "--max_epochs", "2"]
    output = run(command, tmp_path, terminal=False)
    # The effective batch counts both processes; one run folder holds the run.
    found = re.search(r"x (\d+) device\(s\) x (\d+) node\(s\)", output)
    assert found and int(found[1]) * int(found[2]) == 2, output[-3000:]
    assert 0 <= metrics_of(tmp_path)["test/acc"] <= 1


def test_a_stalled_run_fails_with_the_stacks_of_its_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.modules[__name__], "STALL", 2)
    # The child writes to a file of its own (two processes aborting at once on one terminal
    # interleave their lines), and says when it is ready: faulthandler is on by then.
    child = "print('ready', flush=True); import time; time.sleep(600)"
    waits = "import subprocess, sys, time\n"
    waits += f"child = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE,"
    waits += " stderr=open('child.txt', 'w'))\n"
    waits += "child.stdout.readline()\nprint('started', flush=True)\ntime.sleep(600)\n"
    with pytest.raises(AssertionError, match="wrote nothing for 2 s") as failed:
        run([sys.executable, "-c", waits], tmp_path, terminal=True)
    assert "Fatal Python error: Aborted" in str(failed.value)
    assert "Fatal Python error: Aborted" in (tmp_path / "child.txt").read_text()
