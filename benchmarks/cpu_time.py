"""Run a command; print its wall time and the CPU time of every process it started.

`python benchmarks/cpu_time.py python train.py ...`: this process becomes a subreaper (Linux),
so processes that outlive their parent (a loader's fork server) are waited for and counted too.
"""

import ctypes
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main(command: list[str]) -> None:
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    start = time.monotonic()
    ended = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - start
    while True:  # the orphans this process adopted
        try:
            os.wait()
        except ChildProcessError:
            break
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"exit {ended.returncode}: wall {wall:.1f} s, CPU {used.ru_utime + used.ru_stime:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
