"""The README's commands, run as a user types them, in README order.

Default progress bar, default workers, default callbacks and loggers: no test-only flag.
Each test runs once with the output on a pseudo-terminal and once into a file. The only
changes: fewer epochs (`--max_epochs 1`; 3 for the default run, which the project's
tests/test_runs.py runs in full) and trials, a free port for a fixed one, the real file
for a placeholder such as `version_<N>`, and `--accelerator cpu` for a script that asks for
GPUs. The data the README points at (`--data.root ...`) is written where it points, in the
dataset's own format. The template's test session, which runs several projects' suites at once,
gives each process one torch thread (OMP_NUM_THREADS=1, its tests/conftest.py).

A command counts as hung when it stalls: its output (the terminal's or the file's) has not
grown for STALL seconds. Then every Python process it started writes its stacks, on a signal
(tests/stacks/sitecustomize.py), before the command is stopped and its test fails with the
output's tail and those stacks, so a hang is diagnosed from the log alone. A slow command is
not a hung one: a limit on the total time failed the default run on a loaded machine while it
was progressing. The README's commands write their progress bar at every step, into a file
too, and their longest silences (starting up) are short next to STALL.
"""

{% if cookiecutter.deploy == "yes" -%}
import base64
{% endif -%}
import contextlib
import json
import os
import pty
import re
import shlex
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
{%- if cookiecutter.deploy == "yes" %}
import urllib.request
{%- endif %}
from dataclasses import dataclass
from fcntl import ioctl
from pathlib import Path

import fake_data
{%- if cookiecutter.deploy == "yes" %}
import numpy as np
{%- endif %}
{%- if cookiecutter.sweep == "yes" %}
import optuna
{%- endif %}
import pytest
import torch
from logged import scalars
{%- if cookiecutter.deploy == "yes" %}
from PIL import Image
{%- endif %}

pytestmark = [pytest.mark.slow, pytest.mark.user_path]

PROJECT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
OUTPUTS = ["terminal", "file"]
# Seconds without new output after which a command counts as hung. The README's commands
# write at every training step; their longest silences (interpreters starting and importing
# torch, two or three at once under DDP and SLURM, before the first line) took up to 21 s on
# a 2-core machine with a load average of 7 to 9, where the full default run took 280 s
# instead of 20. 180 s leaves room for a machine 8 times slower still, and fails a hung run
# before its processes' own collective timeout (600 s) would.
STALL = 180
# Seconds after which a command that still writes but never ends counts as hung too (a loop
# that retries and logs, say): 60 times the longest command's usual time (the full default
# run), 4 times what it took on that loaded machine, and short enough that it fails here,
# with its stacks, before a CI job's limit stops the whole suite (the template gives a
# generated suite 50 minutes).
CEILING = 20 * 60
# What the processes write their stacks on (tests/stacks/sitecustomize.py). Nothing in the
# project or its libraries handles it; SIGUSR1 would make a run save and stop.
STACKS_SIGNAL = signal.SIGUSR2

# Warnings that the default commands print and that come from other projects, not from
# this one's defaults. Anything else a default command prints as a warning fails the test.
ALLOWED_WARNINGS = [
    # Lightning, on a CPU-only machine, says a GPU would be faster.
    r"GPU available: False",
]
# A warning as Python prints it ("...Warning: ..."), as Lightning prints it ("file.py:12:
# message"), a logged WARNING, or a traceback (one that was raised or one that was ignored).
WARNING_OR_TRACEBACK = re.compile(
    r"\w*Warning: .*|^\S+\.py:\d+: .*|^WARNING.*|^\[W .*|Traceback \(most recent call last\)"
    r"|^Exception ignored in.*",
    re.M,
)

# torchrun's agent on a node other than the first may log this after a finished run: the first
# node's agent, which holds the rendezvous store, exited while this one still read from it
# (pytorch/pytorch#69520, README Troubleshooting). The training and its exit code are fine.
EXIT_BARRIER_RACE = re.compile(r"[^\n]*Error waiting on exit barrier.*?Failed to recv[^\n]*", re.S)


def readme_commands() -> list[str]:
    """Every command in the README's bash blocks: continuations joined, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", (PROJECT / "README.md").read_text(), re.S)
    text = "\n".join(blocks).replace("\\\n", " ")
    lines = [line.split("  #")[0].strip() for line in text.splitlines()]
    return [" ".join(line.split()) for line in lines if line and not line.startswith("#")]


def shown(start: str, *parts: str) -> str:
    """The README's first command that begins with `start` (and holds `parts`)."""
    found = [
        command
        for command in readme_commands()
        if command.startswith(start) and all(part in command for part in parts)
    ]
    assert found, f"the README shows no command that starts with {start!r} (with {parts})"
    return found[0]


@dataclass
class Finished:
    command: str
    returncode: int
    output: str


class UserCommand:
    """A command started in a session of its own, its output to a pseudo-terminal or a file."""

    def __init__(self, command: list[str], cwd: Path, output: str, env: dict[str, str]) -> None:
        self.command = shlex.join(command)
        self.stacks = cwd / ".stacks" / str(time.monotonic_ns())
        self.stacks.mkdir(parents=True)
        path = os.pathsep.join(
            [str(TESTS / "stacks"), str(TESTS), os.environ.get("PYTHONPATH", "")]
        )
        env = {
            **os.environ,
            **env,
            "PYTHONPATH": path,
            "STACKS_DIR": str(self.stacks),
            "STACKS_SIGNAL": STACKS_SIGNAL.name,
        }
        self.chunks: list[bytes] = []
        self.received = 0  # bytes read from the terminal so far
        self.started = self.grew = time.monotonic()
        self.size = 0
        if output == "terminal":
            parent, child = pty.openpty()
            ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
            self.process = subprocess.Popen(
                command, cwd=cwd, env=env, stdin=child, stdout=child, stderr=child,
                start_new_session=True,
            )  # fmt: skip
            os.close(child)
            self.reader = threading.Thread(target=self._read, args=(parent,), daemon=True)
            self.reader.start()
        else:
            self.log = (cwd / f"output-{time.monotonic_ns()}.log").open("wb+")
            self.process = subprocess.Popen(
                command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            self.reader = None

    def _read(self, fd: int) -> None:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: every process holding the terminal has exited
                break
            if not chunk:
                break
            self.chunks.append(chunk)
            self.received += len(chunk)
        os.close(fd)

    def output(self) -> str:
        if self.reader is None:
            self.log.seek(0)
            return self.log.read().decode(errors="replace")
        return b"".join(self.chunks).decode(errors="replace")

    def last_output(self) -> float:
        """When the output last grew (the start if it never did)."""
        size = self.received if self.reader is not None else os.fstat(self.log.fileno()).st_size
        if size != self.size:
            self.size, self.grew = size, time.monotonic()
        return self.grew

    def wait(self, stall: float = STALL) -> Finished:
        return wait_for([self], stall)[0]

    def check(self, stall: float = STALL) -> None:
        """For a test that waits on something else meanwhile (a file, a server's health)."""
        fail_if_stalled([self], stall)

    def signal(self, sig: signal.Signals) -> None:
        """To the command's process group, and to every process of the command that left it
        (torchrun starts its ranks in sessions of their own)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        for pid in self.left_the_group():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def left_the_group(self) -> list[int]:
        """Running Python processes of the command outside its process group: those with a
        stacks file whose command line is still the one the file names (not a reused id)."""
        found = []
        for path in self.stacks.glob("*.txt"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                pid = int(path.stem)
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                running = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                named = path.read_text().split(": ", 1)[1]  # the command line, then stacks
                mine = named.startswith(running.decode().strip())
                if mine and stat[0] != "Z" and int(stat[2]) != self.process.pid:
                    found.append(pid)
        return found

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.process.wait()

    def finish(self) -> Finished:
        self.kill()  # whatever it left behind in its session
        if self.reader is not None:
            self.reader.join(timeout=10)
        return Finished(self.command, self.process.returncode, self.output())

    def stack_dumps(self) -> str:
        """Each process's command line and stacks, by process id; a process that wrote no
        stacks had ended (or did not answer): that tells a rank that died apart."""
        dumps = [
            path.read_text()
            for path in sorted(self.stacks.glob("*.txt"), key=lambda path: int(path.stem))
        ]
        return "\n".join(
            dump if "(most recent call first)" in dump else f"{dump.rstrip()}\n  (no stacks)\n"
            for dump in dumps
        )


def wait_for(
    commands: list[UserCommand], stall: float = STALL, ceiling: float = CEILING
) -> list[Finished]:
    """Waits until every command has ended; fails the test when they stall.

    Commands that run together (the nodes of one job) are waited on together: one of them may
    be silent while the other works (only the first node's rank prints the bar), and when they
    hang, each holds half of the story."""
    while any(command.process.poll() is None for command in commands):
        fail_if_stalled(commands, stall, ceiling)
        time.sleep(0.1)
    return [command.finish() for command in commands]


def fail_if_stalled(
    commands: list[UserCommand], stall: float = STALL, ceiling: float = CEILING
) -> None:
    """Fails the test, with the output's tail and every process's stacks, if none of the
    commands wrote anything for `stall` seconds or they have run for `ceiling` seconds."""
    now = time.monotonic()
    silent = now - max(command.last_output() for command in commands)
    running = now - min(command.started for command in commands)
    if silent < stall and running < ceiling:
        return
    write_stacks(commands)
    for command in commands:
        command.kill()
    why = f"wrote nothing for {silent:.0f} s" if silent >= stall else f"ran {running:.0f} s"
    pytest.fail(
        f"hung ({why}, after {running:.0f} s in all):\n"
        + "\n".join(
            f"$ {command.command}\n{command.output()[-6000:]}\n"
            f"Stacks of its processes:\n{command.stack_dumps()}"
            for command in commands
        )
    )


def write_stacks(commands: list[UserCommand]) -> None:
    """Asks every process of the commands for its stacks and waits until each wrote them.

    Every Python process has a stacks file from its start (sitecustomize), so a member of the
    group that has one and is not a zombie owes a dump; others (bash, a process that ended)
    do not. A dump is many writes, and on a loaded machine a process may wait for the CPU
    before or during them: the files are read once each has grown and none grows any more,
    or after 10 s."""
    before = {}
    for command in commands:
        for pid in [*process_group(command.process.pid), *command.left_the_group()]:
            path = command.stacks / f"{pid}.txt"
            with contextlib.suppress(FileNotFoundError):
                before[path] = path.stat().st_size
        command.signal(STACKS_SIGNAL)
    deadline, sizes = time.monotonic() + 10, {}
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = {path: path.stat().st_size for path in before}
        if now == sizes and all(now[path] > size for path, size in before.items()):
            break
        sizes = now


def process_group(pgid: int) -> list[int]:
    """The running (not zombie) processes of a process group (Linux: /proc)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # the process ended meanwhile
            state, _, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
            if int(group) == pgid and state != "Z":
                members.append(int(stat.parent.name))
    return members


def as_typed(command: str, epochs: bool = True, **replace: str) -> list[str]:
    """The README's `command` as argv: placeholders replaced, then fewer epochs."""
    for old, new in replace.items():
        assert old in command, f"{old!r} is not in {command!r}"
        command = command.replace(old, new)
    argv = shlex.split(command)
    if argv[0] == "python":
        argv[0] = sys.executable
    elif argv[0] == "torchrun":
        argv[:1] = [sys.executable, "-m", "torch.distributed.run"]
    if epochs:
        if "--max_epochs" in argv:
            argv[argv.index("--max_epochs") + 1] = "1"
        else:
            argv += ["--max_epochs", "1"]
    return argv


def run(command: list[str], cwd: Path, output: str, stall: float = STALL, **env: str) -> Finished:
    finished = UserCommand(command, cwd, output, env).wait(stall)
    assert finished.returncode == 0, (
        f"{finished.command} exited with {finished.returncode}:\n" + (finished.output[-6000:])
    )
    assert_no_warnings(finished)
    return finished


def assert_no_warnings(finished: Finished) -> None:
    """No warning or traceback in the output, except the warnings on the allow-list."""
    output = EXIT_BARRIER_RACE.sub("", finished.output.replace("\r\n", "\n").replace("\r", "\n"))
    found = WARNING_OR_TRACEBACK.findall(output)
    unexpected = [w for w in found if not any(re.search(a, w) for a in ALLOWED_WARNINGS)]
    assert not unexpected, f"{finished.command} warned:\n" + "\n".join(unexpected)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def newest_run(cwd: Path) -> Path:
    runs = (cwd / "runs" / "default").glob("version_*/checkpoints/last.ckpt")
    return max(runs, key=lambda p: p.stat().st_mtime).parent.parent


def two_processes(finished: Finished, workspace: Path, runs_before: int) -> None:
    """The run had two processes (the effective batch counts both) and one run folder."""
    found = re.search(r"x (\d+) device\(s\) x (\d+) node\(s\)", finished.output)
    assert found and int(found[1]) * int(found[2]) == 2, finished.output[-3000:]
    assert run_folders(workspace) == runs_before + 1


def run_folders(workspace: Path) -> int:
    return len(list((workspace / "runs" / "default").glob("version_*")))


# For the test of the stall detector: a command that prints steadily for longer than the
# window, one that prints forever, and one that hangs with two processes of its own (one
# started, one forked), each waiting in a function its stacks must name, after a third one
# ended.
STEADY = "import time\nfor step in range(12):\n    print(step, flush=True)\n    time.sleep(0.3)"
ENDLESS = "import time\nwhile True:\n    print('retrying', flush=True)\n    time.sleep(0.3)"
HANGS = """
import os, subprocess, sys, time
subprocess.run([sys.executable, "-c", "pass"], check=True)
def parent_waits(): time.sleep(600)
def forked_child_waits(): time.sleep(600)
started = "import time\\ndef started_child_waits(): time.sleep(600)\\nprint(flush=True)\\n"
child = subprocess.Popen([sys.executable, "-c", started + "started_child_waits()"], stdout=-1)
child.stdout.readline()  # it runs, its handler is in place
# In a session of its own, as torchrun starts its ranks: outside the command's process group.
alone = started.replace("started_child", "own_session_child")
rank = subprocess.Popen(
    [sys.executable, "-c", alone + "own_session_child_waits()"], stdout=-1, start_new_session=True
)
rank.stdout.readline()
ready, tell = os.pipe()
if os.fork() == 0:
    os.write(tell, b"1")
    forked_child_waits()
os.read(ready, 1)
print("working", flush=True)
parent_waits()
"""


@pytest.mark.parametrize("output", OUTPUTS)
def test_a_command_fails_when_it_stalls_not_when_it_is_slow(tmp_path: Path, output: str) -> None:
    window = 3
    steady = UserCommand([sys.executable, "-c", STEADY], tmp_path, output, {})
    assert steady.wait(stall=window).returncode == 0  # 3.6 s in all, never 3 s silent

    hangs = UserCommand([sys.executable, "-c", HANGS], tmp_path, output, {})
    with pytest.raises(pytest.fail.Exception) as failed:
        hangs.wait(stall=window)
    message = str(failed.value)
    assert re.search(r"hung \(wrote nothing for \d+ s", message), message
    assert "working" in message  # the output's tail
    waiting = ("parent_waits", "started_child_waits", "forked_child_waits", "own_session_child")
    for waits in waiting:
        assert f"in {waits}" in message, message  # every process's stacks
    assert "forked from" in message
    assert re.search(r"-c pass\n  \(no stacks\)", message), message  # the one that ended
    deadline = time.monotonic() + 10  # SIGKILL is sent, not yet necessarily delivered
    while process_group(hangs.process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert process_group(hangs.process.pid) == [], "the hung command's processes still run"
    while hangs.left_the_group() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert hangs.left_the_group() == [], "the hung command's own-session process still runs"

    endless = UserCommand([sys.executable, "-c", ENDLESS], tmp_path, output, {})
    with pytest.raises(pytest.fail.Exception, match=r"hung \(ran \d+ s"):
        wait_for([endless], ceiling=window)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A copy of the user's starting point: the project's scripts and configs, and the data
    the README's commands point at."""
    for script in PROJECT.glob("*.py"):
        (tmp_path / script.name).write_text(script.read_text())
    for folder in ("configs", "scripts"):
        subprocess.run(["cp", "-r", str(PROJECT / folder), str(tmp_path)], check=True)
    root = re.search(r"--data\.root (\S+)", shown("python train.py"))
    if root:
        fake_data.write_dataset(tmp_path / root.group(1))
    return tmp_path


@pytest.mark.parametrize("output", OUTPUTS)
def test_training_commands_as_the_readme_shows_them(workspace: Path, output: str) -> None:
    train = shown("python train.py")
    # The default run (in full, as typed: the project's tests/test_runs.py), a few epochs: the
    # best checkpoint is never worse than the last one on validation loss.
    default = run([*as_typed(train, epochs=False), "--max_epochs", "3"], workspace, output)
    assert "Best checkpoint:" in default.output and "Test:" in default.output
    run_folder = newest_run(workspace)
    tested = json.loads((run_folder / "test_metrics.json").read_text())["checkpoint"]
    states = torch.load(workspace / tested, weights_only=True)["callbacks"].values()
    (state,) = [s for s in states if s.get("monitor")]
    val_losses = [value for _, value in scalars(run_folder, "val/loss")]
    assert state["monitor"] == "val/loss"
    assert float(state["best_model_score"]) == pytest.approx(min(val_losses))
    assert float(state["best_model_score"]) <= val_losses[-1]  # last.ckpt's
    # Transfer learning: that run's best checkpoint is where the next ones start.
    start = {"runs/default/version_<N>/checkpoints/<best>.ckpt": tested}
    for command in (f"{train} --init_from", f"{train} --config configs/model/finetune.yaml"):
        started = run(as_typed(shown(command), **start), workspace, output)
        assert f"Started from {tested}: " in started.output

    for command in (
        shown(f"{train} --devices 2 --strategy ddp_spawn"),
        shown(f"{train} --devices 2"),
        shown("torchrun --standalone --nproc_per_node 2 train.py"),
    ):
        before = run_folders(workspace)
        two_processes(run(as_typed(command), workspace, output), workspace, before)

    run(as_typed(shown(f"{train} --precision bf16-mixed")), workspace, output)
    # Model extras, one flag each: a penalty the classifier carries, an average of the weights.
    run(as_typed(shown(f"{train} --model.backbone.head_penalty")), workspace, output)
    assert [value for _, value in scalars(newest_run(workspace), "train/regularization_epoch")]
    run(as_typed(shown(f"{train} --config configs/model/ema.yaml")), workspace, output)
    averaged = torch.load(newest_run(workspace) / "checkpoints" / "last.ckpt", weights_only=True)
    assert "current_model_state" in averaged  # beside the average, which validation used
    timm = shown(f"{train} --model.backbone {{ cookiecutter.package_name }}.backbones.TimmBackbone")
    run(as_typed(timm), workspace, output)
    # The headline metric: checkpoint choice, early stopping and the summary follow one flag.
    by_f1 = run(as_typed(shown(f"{train} --monitor val/f1")), workspace, output)
    run_folder = newest_run(workspace)
    states = torch.load(next((run_folder / "checkpoints").glob("epoch*.ckpt")), weights_only=True)
    (best,) = [state for state in states["callbacks"].values() if state.get("monitor")]
    stoppers = [key for key in states["callbacks"] if key.startswith("EarlyStopping")]
    assert best["monitor"] == "val/f1"
    assert stoppers == ["EarlyStopping{'monitor': 'val/f1', 'mode': 'max'}"]
    f1 = [value for _, value in scalars(run_folder, "val/f1")]
    assert float(best["best_model_score"]) == pytest.approx(max(f1))
    assert re.search(r"Best checkpoint: +\S+-val_f1=[0-9.]+\.ckpt +\(val/f1 ", by_f1.output)
    # In README order, the newest run before a resume uses other config files.
    run(as_typed(shown(f"{train} --config configs/model/sgd_step.yaml")), workspace, output)
    before, newest = run_folders(workspace), newest_run(workspace)
    resumed = run(
        [*as_typed(shown("python train.py --ckpt_path last"), epochs=False), "--max_epochs", "2"],
        workspace,
        output,
    )
    assert run_folders(workspace) == before  # it went on in the newest run's folder
    assert "Best checkpoint:" in resumed.output
    state = torch.load(newest / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["epoch"] == 1
    assert state["hyper_parameters"]["scheduler"]["class_path"].endswith("ReduceLROnPlateau")
{%- if cookiecutter.cluster == "yes" %}


def fake_srun(folder: Path) -> Path:
    """An `srun` for one node: it starts SLURM_NTASKS copies of its command with task ids."""
    folder.mkdir()
    script = folder / "srun"
    script.write_text(
        "#!/bin/bash\n"
        "pids=()\n"
        "for ((i = 0; i < SLURM_NTASKS; i++)); do\n"
        '    SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_NODEID=0 "$@" &\n'
        "    pids+=($!)\n"
        "done\n"
        "status=0\n"
        'for pid in "${pids[@]}"; do wait "$pid" || status=$?; done\n'
        'exit "$status"\n'
    )
    script.chmod(0o755)
    return folder


@pytest.mark.parametrize("output", OUTPUTS)
def test_cluster_commands_as_the_readme_shows_them(workspace: Path, output: str) -> None:
    port, before = str(free_port()), run_folders(workspace)
    nodes = [
        UserCommand(
            as_typed(
                shown(f"torchrun --nnodes 2 --nproc_per_node 1 --node_rank {rank}"),
                **{"29500": port},
            ),
            workspace,
            output,
            {},
        )
        for rank in (0, 1)
    ]
    finished = wait_for(nodes)
    for node in finished:
        assert node.returncode == 0, node.output[-6000:]
        assert_no_warnings(node)
    two_processes(finished[0], workspace, before)

    srun = fake_srun(workspace / "bin")
    slurm = {
        "PATH": f"{srun}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NTASKS": "2",
        "SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NODELIST": "localhost",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
    }  # fmt: skip
    # The script runs here in place of sbatch; it asks for GPUs, this test has a CPU.
    command = ["bash", *as_typed(shown("sbatch scripts/slurm/train.sbatch"))[1:]]
    command += ["--accelerator", "cpu"]
    before = run_folders(workspace)
    two_processes(run(command, workspace, output, **slurm), workspace, before)
{%- endif %}


@pytest.mark.parametrize("output", OUTPUTS)
def test_evaluate_commands_as_the_readme_shows_them(workspace: Path, output: str) -> None:
    run(as_typed(shown("python train.py")), workspace, output)
    folder = newest_run(workspace)
    evaluated = run(as_typed(shown("python evaluate.py"), epochs=False), workspace, output)
    assert "test/acc" in evaluated.output
    run(as_typed(shown("python evaluate.py --ckpt_path last"), epochs=False), workspace, output)
    assert json.loads((folder / "eval_metrics.json").read_text())["checkpoint"].endswith(
        "last.ckpt"
    )
    # The run folder keeps what training logged next to what the evaluations added.
    assert scalars(folder, "val/loss") and scalars(folder, "test/acc")


@pytest.mark.parametrize("output", OUTPUTS)
def test_repeat_and_results_commands_as_the_readme_shows_them(workspace: Path, output: str) -> None:
    repeats = workspace / "runs" / "repeats"
    first = run(as_typed(shown("python repeat.py --seeds 3")), workspace, output)
    assert "mean ± std" in first.output
    other = run(as_typed(shown("python repeat.py", "--name no_smoothing")), workspace, output)
    assert "0 of 3 run(s) finished" in other.output
    for name in ("default", "no_smoothing"):
        summary = json.loads((repeats / name / "summary.json").read_text())
        assert sorted(summary["runs"]) == ["seed_0", "seed_1", "seed_2"]
    listed = run(as_typed(shown("python results.py"), epochs=False), workspace, output)
    assert "runs/repeats/no_smoothing" in listed.output
    assert "model.loss.label_smoothing" in listed.output
    compared = run(as_typed(shown("python results.py --compare"), epochs=False), workspace, output)
    assert "paired runs (seed_0, seed_1, seed_2)" in compared.output
    differ = run(as_typed(shown("python results.py --diff"), epochs=False), workspace, output)
    assert "model.loss.init_args.label_smoothing: 0.1 -> 0" in differ.output
    run(as_typed(shown("python repeat.py --folds 5")), workspace, output)
    summary = json.loads((repeats / "cv5" / "summary.json").read_text())
    assert sorted(summary["runs"]) == [f"fold_{k}" for k in range(5)]
    markdown = run(as_typed(shown("python results.py runs/"), epochs=False), workspace, output)
    assert "| runs/repeats/cv5 |" in markdown.output
{%- if cookiecutter.dataset == "image_folder" %}


@pytest.mark.parametrize("output", OUTPUTS)
def test_shards_commands_as_the_readme_shows_them(workspace: Path, output: str) -> None:
    converted = run(as_typed(shown("python convert.py"), epochs=False), workspace, output)
    assert "Shards: shards (" in converted.output
    train = shown("python train.py --data configs/data/shards.yaml")
    trained = run(as_typed(train), workspace, output)
    assert "Test:" in trained.output
    assert "ShardsDataModule" in (newest_run(workspace) / "config.yaml").read_text()
{%- endif %}
{%- if cookiecutter.deploy == "yes" %}


@pytest.mark.parametrize("output", OUTPUTS)
def test_deploy_commands_as_the_readme_shows_them(workspace: Path, output: str) -> None:
    run(as_typed(shown("python train.py")), workspace, output)
    folder = newest_run(workspace)
    run(as_typed(shown("python export.py"), epochs=False), workspace, output)
    (onnx,) = (folder / "export").glob("*.onnx")

    images = workspace / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for path in (images / "a.png", images / "b.png", workspace / "photo.png"):
        Image.fromarray(rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)).save(path)
    placeholder = "runs/default/version_<N>/export/<name>.onnx"
    predicted = run(
        as_typed(shown("python predict.py --model"), epochs=False, **{placeholder: str(onnx)}),
        workspace, output,
    )  # fmt: skip
    assert all(name in predicted.output for name in ("a.png", "b.png", "photo.png"))
    checkpoint = f"{folder.relative_to(workspace)}/checkpoints/last.ckpt"
    command = shown("python predict.py --model runs/default/version_<N>/checkpoints/last.ckpt")
    command = command.replace("runs/default/version_<N>/checkpoints/last.ckpt", checkpoint)
    run(as_typed(command, epochs=False), workspace, output)
    assert len((workspace / "preds.csv").read_text().splitlines()) == 2 + 1  # images/ and a header

    port = str(free_port())
    server = UserCommand(
        as_typed(shown("python serve.py"), epochs=False, **{placeholder: str(onnx), "8000": port}),
        workspace, output, {},
    )  # fmt: skip
    try:
        while not healthy(port):
            assert server.process.poll() is None, server.output()[-3000:]
            server.check()
            time.sleep(0.5)
        body = json.dumps(
            {"image": base64.b64encode((workspace / "photo.png").read_bytes()).decode()}
        )
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/predict", data=body.encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as response:
            assert json.loads(response.read())["class"]
    finally:
        server.process.send_signal(signal.SIGTERM)
        finished = server.wait(stall=60)
    assert_no_warnings(finished)


def healthy(port: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
{%- endif %}
{%- if cookiecutter.sweep == "yes" %}


@pytest.mark.parametrize("output", OUTPUTS)
def test_sweep_commands_as_the_readme_shows_them(workspace: Path, output: str) -> None:
    first = as_typed(shown("python sweep.py --n_trials"), epochs=False)
    first[first.index("--n_trials") + 1] = "2"
    if output == "file":
        # Stopped by SIGTERM to the whole process group (a scheduler, `kill -- -PGID`) while
        # the second trial trains, then continued by the same command.
        first += ["--max_epochs", "5"]
        sweep = UserCommand(first, workspace, output, {})
        started = workspace / "runs" / "sweeps" / "default" / "trial_001"
        while not started.exists() and sweep.process.poll() is None:
            sweep.check()
            time.sleep(0.2)
        sweep.signal(signal.SIGTERM)
        stopped = sweep.wait()
        assert "Stopped. Trial 1 is recorded as failed" in stopped.output, stopped.output[-3000:]
        assert_no_warnings(stopped)
    else:
        first += ["--max_epochs", "1"]
    finished = run(first, workspace, output)
    assert "Best trial:" in finished.output
    study = optuna.load_study(
        study_name="default", storage=f"sqlite:///{workspace}/runs/sweeps/default/study.db"
    )
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 2
    if output == "file":
        assert done[1].params == study.trials[1].params  # the stopped trial ran again

    second = as_typed(shown("python sweep.py --config"))
    second[second.index("--n_trials") + 1] = "2"
    assert "Best trial:" in run(second, workspace, output).output
    assert (workspace / "runs" / "sweeps" / "default" / "best.yaml").is_file()
    # The best trial again: a run of train.py's own, not one more run of the trial.
    before = run_folders(workspace)
    best = shown("python train.py --config runs/sweeps/default/best.yaml")
    run(as_typed(best), workspace, output)
    assert run_folders(workspace) == before + 1
{%- endif %}
