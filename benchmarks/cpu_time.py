"""Run a command; print its wall time and the CPU time of every process it started.

`python benchmarks/cpu_time.py python train.py ...`: this process becomes a subreaper (Linux),
so processes that outlive their parent (a loader's fork server) are waited for and counted too.
The command's output is dropped, or with `--keep-output` (first) let through, the figures after it.
"""

import ctypes
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
ORPHANS_END = 10


def main(command: list[str]) -> None:
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    output = None if command[0] == "--keep-output" else subprocess.DEVNULL
    command = command[1:] if output is None else command
    start = time.monotonic()
    ended = subprocess.run(command, stdout=output, stderr=output)
    wall = time.monotonic() - start
    # The orphans this process adopted, which end when they see their parent gone; one that
    # is still running after ORPHANS_END seconds is left to whoever started this process.
    deadline, left = time.monotonic() + ORPHANS_END, ""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0 and time.monotonic() > deadline:
            left = " (processes still running are not counted)"
            break
        time.sleep(0 if pid else 0.05)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = used.ru_utime + used.ru_stime
    print(f"exit {ended.returncode}: wall {wall:.1f} s, CPU {cpu:.1f} s{left}", flush=True)
    sys.exit(ended.returncode)


if __name__ == "__main__":
    main(sys.argv[1:])
