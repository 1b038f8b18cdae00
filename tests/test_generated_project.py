"""The generated project's own tests pass for each dataset, and the library's tests pass
against the projects they are written for."""

import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from combinations import missing_values
from helpers import (
    CASES,
    DATASET_CASES,
    DEFAULTS,
    LIBRARY_CASES,
    LIBRARY_TESTS,
    QUESTIONS,
    REPO,
    Render,
    add_library_tests,
    render,
    run,
    session_members,
    stop,
)

# The renders whose own test suite runs (fast and slow: `pytest -m ""`): between them, every
# value of every question.
SUITE_RUNS = {case: {**DEFAULTS, **CASES[case]} for case in DATASET_CASES}

# The library's tests, each group a pytest run of its own in a render of its own: (case, pytest
# arguments). Against digits (the default dataset and logger) every test runs, slow ones too: every
# README command as a user types it (on a terminal and into a file, a run each), several
# processes, torch.compile. Against the other renders, only what depends on their answers:
# image_folder's README commands, loaders (worker processes reading files on disk), shards (image
# folders only) and the tests written for more than one dataset (the fork contract, transfer);
# the fast tests that read a run's logged metrics and files, against each other logger (CSV:
# image_folder; MLflow beside CSV: mnist; Weights & Biases beside CSV, and every feature left out:
# fashion_mnist); torchvision's datasets' loaders (mnist).
LIBRARY_FILES = sorted(path.name for path in LIBRARY_TESTS.rglob("test_*.py"))
USER_PATHS = ["test_user_paths.py"]
FEATURES = ["test_deploy.py", "test_sweep.py", "test_cluster.py", "test_scale.py"]
SHARDS = ["test_shards.py"]  # image folders only: in an image_folder run
LOGGED = ["test_compat.py", "test_train.py", "test_repeat.py"]
FOLDER_DATA = ["test_loaders.py", *SHARDS, *LOGGED, "test_fork.py", "test_transfer.py"]
REST = [name for name in LIBRARY_FILES if name not in USER_PATHS + FEATURES + SHARDS]
# Each dataset's own bad data (its fixture in tests/datasets/), refused in one line.
BAD_DATA = "tests/test_reliability.py::test_bad_data_is_refused_by_name_before_anything_is_written"
# The stall detector's own test runs no README command: against digits only.
HARNESS_ONLY = "test_a_command_fails_when_it_stalls"
LIBRARY_RUNS = {
    **{
        f"library-{case}-readme-{output}": (case, ["-m", "", "-k", selects + also, *USER_PATHS])
        for case, also in (("image_folder", f" and not {HARNESS_ONLY}"), ("digits", ""))
        for output, selects in (("file", "not terminal"), ("terminal", "terminal"))
    },
    "library-digits-rest": ("digits", ["-m", "", *REST]),
    "library-digits-features": ("digits", ["-m", "", *FEATURES]),
    "library-image_folder-data": ("image_folder", ["-m", "not slow", *FOLDER_DATA, BAD_DATA]),
    "library-mnist": ("mnist", ["-m", "not slow", "test_loaders.py", *LOGGED, BAD_DATA]),
    "library-fashion_mnist": ("fashion_mnist", ["-m", "not slow", *LOGGED, "test_fork.py"]),
}
RUNS = {
    **{name: (case, arguments) for name, (case, arguments) in LIBRARY_RUNS.items()},
    **{case: (case, ["-m", ""]) for case in SUITE_RUNS},
}

# Two suites run at a time, beside the template's other tests (conftest.py starts them as the
# test loop begins). Much of a suite is waiting (interpreters starting, launchers, servers,
# ranks waiting for each other), so they share this machine's cores with little loss. The
# longest start first.
PARALLEL = 2


def test_suite_runs_cover_every_answer() -> None:
    assert missing_values(QUESTIONS, SUITE_RUNS.values()) == {}


def test_every_library_test_runs(tmp_path: Path) -> None:
    """Against digits, every file a render of it gets (all but the shards'); the shards' against
    image_folder; each group's files are in the render it runs against."""
    cases = {case for case, _ in LIBRARY_RUNS.values()}
    files = {case: add_library_tests(render(tmp_path / case, **CASES[case])) for case in cases}
    assert sorted(USER_PATHS + FEATURES + REST) == files["digits"]
    assert sorted(files["image_folder"]) == LIBRARY_FILES
    runs_against: dict[str, set[str]] = {}
    for name, (case, arguments) in LIBRARY_RUNS.items():
        named = {argument for argument in arguments if argument.endswith(".py")}
        assert named and named <= set(files[case]), name
        for file in named:
            runs_against.setdefault(file, set()).add(case)
    assert set(LIBRARY_CASES) == set(files)  # test_library.py checks the rendered tests of each
    # A test written for several datasets or loggers runs against two of them at least.
    for path in LIBRARY_TESTS.rglob("test_*.py"):
        for answer in re.findall(r"cookiecutter\.(dataset|logger)\b", path.read_text()):
            values = {{**DEFAULTS, **CASES[case]}[answer] for case in runs_against[path.name]}
            assert len(values) > 1, f"{path.name} runs against one {answer} only: {values}"
    assert len(LIBRARY_FILES) > 10


def run_suite(rendered: Render, workdir: Path, arguments: list[str]) -> tuple[str, str]:
    """Install a render into a folder of its own and run its tests: (install, tests) output."""
    site = workdir / "site"
    # torch and the rest come from this environment, untouched. python_version changes only
    # requires-python and ruff's target (test_render.py checks both), so its code runs under
    # this interpreter whichever version it names.
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
    pip += ["--no-index", "--ignore-requires-python", "--target", str(site)]
    install = run([*pip, str(rendered.path)], cwd=workdir)
    if install.returncode != 0 or STOPPING.is_set():
        return install.stdout, ""
    files = [f"tests/{name}" if name.endswith(".py") else name for name in arguments]
    # Through cpu_time.py: the suite's last line is the CPU time of every process it started,
    # what it costs whatever else shared the machine.
    command = [sys.executable, str(REPO / "benchmarks" / "cpu_time.py"), "--keep-output"]
    command += [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=5"]
    sessions: list[int] = []

    def started(session: int) -> None:
        sessions.append(session)
        RUNNING.add(session)
        if STOPPING.is_set():  # the session ended as this one started
            stop(session_members(session))

    try:
        tests = run(
            [*command, *files],
            cwd=rendered.path,
            # Its multi-process tests end within limits of their own (a stalled command within
            # 180 s), so this only bounds the total.
            timeout=3600,
            started=started,
            # src/ first: the package reads configs/default.yaml beside src/, as in the editable
            # install a user makes; the installed copy shows the project installs.
            PYTHONPATH=os.pathsep.join([str(rendered.path / "src"), str(site)]),
        )
    finally:
        RUNNING.difference_update(sessions)
    return install.stdout, tests.stdout + f"\n[exit status {tests.returncode}]"


# The suites of this session: started by start_suites, stopped by stop_suites (conftest.py).
STARTED: dict[str, Future] = {}
RUNNING: set[int] = set()  # the session ids of the suites' pytest processes now running
STOPPING = threading.Event()
RENDERS: list[Path] = []  # the folder that holds their renders


def start_suites(names: Iterable[str]) -> None:
    """Render a project for each of these suites and start them in the background, two at a
    time, longest first (RUNS' order)."""
    base = Path(tempfile.mkdtemp(prefix="generated-suites-"))
    RENDERS.append(base)
    # Rendered here, one after another: cookiecutter changes the working directory.
    renders = {}
    for name in [name for name in RUNS if name in set(names)]:
        workdir = base / name
        rendered = render(workdir, **CASES[RUNS[name][0]])
        if name in LIBRARY_RUNS:
            add_library_tests(rendered)
        renders[name] = (rendered, workdir)
    pool = ThreadPoolExecutor(max_workers=PARALLEL)
    for name, (rendered, workdir) in renders.items():
        STARTED[name] = pool.submit(run_suite, rendered, workdir, RUNS[name][1])
    pool.shutdown(wait=False)


def stop_suites() -> None:
    """At the session's end, however it ends: the suites not started yet do not start, the
    running ones stop with every process they started, and their renders go."""
    STOPPING.set()
    for future in STARTED.values():
        future.cancel()
    while RUNNING:
        for session in list(RUNNING):
            stop(session_members(session))
        time.sleep(0.5)  # the thread that waited for it records that it ended
    for base in RENDERS:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def suites() -> dict[str, Future]:
    """The suites this session started (conftest.py, as the tests began); each test waits for
    its own."""
    return STARTED


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_generated_suite_passes(suites: dict[str, Future], name: str) -> None:
    install, tests = suites[name].result()
    assert tests, f"the render did not install:\n{install}"
    # The slowest tests and the total, in the log of every run: the time each suite takes.
    print(f"{name}: {tests[-1500:]}")
    assert tests.endswith("[exit status 0]"), tests
    passed = re.search(r"(\d+) passed", tests)
    assert passed and int(passed.group(1)) > 0, tests
