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
    output, quiet_since = b"", time.monotonic()
    stacks_until = None  # once the run stalled: its stacks are read until then
    while True:
        grown = False
        if terminal:
            if select.select([reader], [], [], 1)[0]:
                try:
                    chunk = os.read(reader, 65536)
                except OSError:  # every process holding the terminal has closed it
                    chunk = b""
                if not chunk:
                    break
                output, grown = output + chunk, True
        else:
            time.sleep(1)
            grown = log.stat().st_size > len(output)
            output = log.read_bytes()
        now, ended = time.monotonic(), process.poll() is not None
        if grown:
            quiet_since = now
        if stacks_until is not None:
            if now > stacks_until:
                break
        elif ended and not grown and (not terminal or now - quiet_since > 5):
            break  # (a process left behind may keep the terminal open)
        elif now - quiet_since > STALL:
            os.killpg(process.pid, signal.SIGABRT)  # every Python process prints its stacks
            stacks_until = now + 10
    stalled = stacks_until is not None
    if stalled:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    if terminal:
        os.close(reader)
    text = output.decode(errors="replace")
    assert not stalled, f"{command} wrote nothing for {STALL} s; its stacks:\n{text[-20000:]}"
    assert process.wait() == 0, f"{command} exited with {process.returncode}:\n{text[-6000:]}"
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
    # The child writes to a file of its own: two processes aborting at once on one terminal
    # interleave their lines.
    child = "import time; time.sleep(600)"
    waits = "import subprocess, sys, time\n"
    waits += f"subprocess.Popen([sys.executable, '-c', {child!r}], stderr=open('child.txt', 'w'))\n"
    waits += "print('started', flush=True)\ntime.sleep(600)\n"
    with pytest.raises(AssertionError, match="wrote nothing for 2 s") as failed:
        run([sys.executable, "-c", waits], tmp_path, terminal=True)
    assert "Fatal Python error: Aborted" in str(failed.value)
    assert "Fatal Python error: Aborted" in (tmp_path / "child.txt").read_text()
