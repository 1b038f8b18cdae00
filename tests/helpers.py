"""Render the template with cookiecutter's Python API and run tools inside the render."""

import contextlib
import hashlib
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from cookiecutter.generate import generate_files
from cookiecutter.main import cookiecutter

from combinations import case_id, choice_questions, covering_set

REPO = Path(__file__).resolve().parents[1]

# The multiple-choice questions of cookiecutter.json, and the combinations of their
# answers that get the static checks (every combination, or every pair of values).
QUESTIONS = choice_questions(REPO / "cookiecutter.json")
COMBINATIONS = {case_id(answers): answers for answers in covering_set(QUESTIONS)}
DEFAULTS = {name: values[0] for name, values in QUESTIONS.items()}

# The default answers, plus one render per dataset that together give every other
# option value at least once: each license, both github_actions, each python_version, each
# logger, and both answers of each feature (fashion_mnist leaves every feature out).
CASES: dict[str, dict[str, str]] = {
    "default": {},
    "digits": {
        "dataset": "digits",
        "license": "BSD-3-Clause",
        "github_actions": "no",
        "python_version": "3.10",
        "project_name": "Digit Reader",
        # The default dataset and logger: its suite runs every README command as written.
        "logger": "tensorboard",
        "author_name": "Ada Lovelace",
    },
    "mnist": {
        "dataset": "mnist",
        "license": "Apache-2.0",
        "github_actions": "yes",
        "python_version": "3.12",
        "project_name": "MNIST Baseline",
        "logger": "mlflow",
        "author_name": "Alan Turing",
    },
    "fashion_mnist": {
        "dataset": "fashion_mnist",
        "license": "none",
        "github_actions": "no",
        "python_version": "3.13",
        "project_name": "Wardrobe",
        "logger": "wandb",
        "author_name": "Grace Hopper",
        "deploy": "no",
        "sweep": "no",
        "cluster": "no",
    },
    "cifar10": {
        "dataset": "cifar10",
        "license": "MIT",
        "github_actions": "yes",
        "python_version": "3.11",
        "project_name": "Tiny Photos",
        "logger": "tensorboard",
        "author_name": "Katherine Johnson",
    },
    "image_folder": {
        "dataset": "image_folder",
        "license": "Apache-2.0",
        "github_actions": "no",
        "python_version": "3.13",
        "project_name": "Leaf Disease Classifier",
        "logger": "csv",
        "author_name": "Barbara Liskov",
    },
}
DATASET_CASES = [name for name in CASES if name != "default"]

# What test_render.py checks: the named cases above and the computed combinations.
RENDERS = {**CASES, **COMBINATIONS}

# Template syntax (or the word) left in a rendered file.
LEFTOVER = re.compile(rb"(?<!\$)\{\{|\{%|\{#|cookiecutter")

# Written by the tools the tests run inside a render, never by the template.
CACHES = {"__pycache__", ".pytest_cache", ".ruff_cache"}


@dataclass(frozen=True)
class Render:
    """A generated project and the context cookiecutter rendered it with."""

    path: Path
    context: dict[str, Any]

    @property
    def answers(self) -> dict[str, Any]:
        return self.context["cookiecutter"]

    @property
    def package(self) -> Path:
        return self.path / "src" / self.answers["package_name"]


def render(workdir: Path, **answers: str) -> Render:
    """Render the template without prompts into workdir/out.

    Cookiecutter's user config and replay file live in workdir/cookiecutter, so no
    user setting leaks in and the replay file tells exactly which context was used.
    """
    settings = workdir / "cookiecutter"
    settings.mkdir(parents=True)
    config = settings / "config.yaml"
    config.write_text(
        f"cookiecutters_dir: {json.dumps(str(settings / 'cache'))}\n"
        f"replay_dir: {json.dumps(str(settings / 'replay'))}\n"
    )
    output = workdir / "out"
    output.mkdir()
    project = cookiecutter(
        str(REPO),
        no_input=True,
        extra_context=answers,
        output_dir=str(output),
        config_file=str(config),
    )
    (replay,) = (settings / "replay").glob("*.json")
    return Render(Path(project), json.loads(replay.read_text()))


# The library's tests: rendered into a project's tests/ folder with the project's answers, so
# they run against that project, and shipped in none (the library is tested here, once).
LIBRARY_TESTS = REPO / "library_tests"
# The projects they run against (test_generated_project.py: which tests against which): the
# default dataset and logger; image files read by loader workers, with a CSV logger; MLflow and
# Weights & Biases beside CSV, torchvision's datasets, every feature left out.
LIBRARY_CASES = ["digits", "image_folder", "mnist", "fashion_mnist"]
LIBRARY_FEATURE_TESTS = {
    "deploy": ["test_deploy.py"],
    "sweep": ["test_sweep.py"],
    "cluster": ["test_cluster.py"],
}


def add_library_tests(rendered: Render) -> list[str]:
    """Write the library's tests into the render's tests/ folder: the names of the test files.

    They read metrics from the run folder's first logger (mlflow and wandb runs keep a CSVLogger
    first) through tests/logged.py, and a feature's tests come with the feature only.
    """
    before = set((rendered.path / "tests").iterdir())
    generate_files(
        repo_dir=str(LIBRARY_TESTS),
        context={"cookiecutter": rendered.answers},
        output_dir=str(rendered.path.parent),
        overwrite_if_exists=True,
    )
    tests = rendered.path / "tests"
    logger = "tensorboard" if rendered.answers["logger"] == "tensorboard" else "csv"
    (tests / "logged" / f"{logger}.py").replace(tests / "logged.py")
    shutil.rmtree(tests / "logged")
    for feature, names in LIBRARY_FEATURE_TESTS.items():
        if rendered.answers[feature] != "yes":
            for name in names:
                (tests / name).unlink()
    if rendered.answers["dataset"] != "image_folder":  # shards are for image folders
        for name in ("test_shards.py", "shard_probe.py", "s3_server.py"):
            (tests / name).unlink()
    added = set(tests.iterdir()) - before
    return sorted(path.name for path in added if path.name.startswith("test_"))


def import_cli(rendered: Render) -> ModuleType:
    """Import the render's `<package>.cli` from its src/, in this process.

    Lightning and the rest are imported once for all renders (a new interpreter per render
    spends seconds on that alone); the render's own modules are imported afresh each time
    and removed again after, whichever render came before.
    """
    package = rendered.answers["package_name"]

    def forget() -> None:
        for name in [n for n in sys.modules if n == package or n.startswith(f"{package}.")]:
            del sys.modules[name]

    saved = list(sys.path)
    forget()
    sys.path.insert(0, str(rendered.path / "src"))
    try:
        return importlib.import_module(f"{package}.kit.cli")
    finally:
        sys.path[:] = saved
        forget()


def files(root: Path) -> list[Path]:
    """Every file and folder under root, except tool caches."""
    return sorted(
        path for path in root.rglob("*") if not CACHES & set(path.relative_to(root).parts)
    )


def tree(root: Path) -> dict[str, str]:
    """Relative path -> content hash (or 'folder'), to compare a tree before and after."""
    return {
        str(path.relative_to(root)): (
            "folder" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
        )
        for path in files(root)
    }


def run(
    command: list[str],
    cwd: Path,
    timeout: float = 600,
    started: Callable[[int], object] | None = None,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """Run a command with extra environment variables; stdout and stderr together.

    It runs in a session of its own, with no input, whose id `started` gets. Past `timeout`
    seconds it is stopped with every process it started, and the output so far ends with a line
    that says so.
    """
    # A file, not a pipe: a process left behind holding it open cannot block the read.
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **env},
            # Nothing to read: a command that prompts fails instead of waiting.
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        if started is not None:
            started(process.pid)
        try:
            process.wait(timeout=timeout)
            note = ""
        except subprocess.TimeoutExpired:
            stop([process.pid, *descendants(process.pid)])
            process.kill()  # in case /proc is missing and stop() could not see it
            process.wait()
            note = f"\n[stopped after {timeout:.0f} s, with every process it started]\n"
        # Launchers (torchrun) whose own parent timed out stay in the session; stop them.
        stop(session_members(process.pid))
        log.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, log.read() + note)


def processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, session id) of every process; empty where /proc is missing."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name, in parentheses, may hold spaces: split after it.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(stat.parent.name)] = (int(fields[1]), int(fields[3]))
    return table


def descendants(pid: int) -> list[int]:
    """Every process below pid, including those that started a session of their own."""
    table = processes()
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        children = [child for child, (ppid, _) in table.items() if ppid == parent]
        found += children
        todo += children
    return found


def session_members(session: int) -> list[int]:
    return [pid for pid, (_, sid) in processes().items() if sid == session]


def stop(pids: list[int], grace: float = 10) -> None:
    """SIGTERM (launchers then stop their workers), then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid in pids if running(pid)]
        if not alive:
            return
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(running(pid) for pid in alive):
            time.sleep(0.2)


def running(pid: int) -> bool:
    """Whether pid is a process that has not exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def ruff(*args: str) -> list[str]:
    """The command for ruff from this environment, without a cache written into renders."""
    return [sys.executable, "-m", "ruff", *args, "--no-cache"]
