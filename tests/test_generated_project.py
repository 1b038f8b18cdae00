"""The generated project's own test suite passes, for each dataset."""

import os
import re
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from combinations import missing_values
from helpers import CASES, DATASET_CASES, DEFAULTS, QUESTIONS, Render, render, run

# The renders whose own test suite runs: between them, every value of every question.
SUITE_RUNS = {case: {**DEFAULTS, **CASES[case]} for case in DATASET_CASES}

# The digits render (the default dataset and logger) also runs its slow tests: every README
# command as a user types it, several processes, torch.compile. The image_folder render (whose
# loaders start worker processes) runs the README's commands too; its other slow tests do not
# depend on the dataset. The others run their default selection, which covers everything
# dataset-specific.
SELECT = {"digits": ["-m", ""], "image_folder": ["-m", "not slow or user_path"]}

# Two suites run at a time. Much of a suite is waiting (interpreters starting, launchers,
# servers, ranks waiting for each other), so two share this machine's cores with little loss
# and the whole run takes about a third less time. The longest suites start first.
PARALLEL = 2


def test_suite_runs_cover_every_answer() -> None:
    assert missing_values(QUESTIONS, SUITE_RUNS.values()) == {}


def run_suite(rendered: Render, workdir: Path, case: str) -> tuple[str, str]:
    """Install a render into a folder of its own and run its tests: (install, tests) output."""
    site = workdir / "site"
    # torch and the rest come from this environment, untouched. python_version changes only
    # requires-python and ruff's target (test_render.py checks both), so its code runs under
    # this interpreter whichever version it names.
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
    pip += ["--no-index", "--ignore-requires-python", "--target", str(site)]
    install = run([*pip, str(rendered.path)], cwd=workdir)
    if install.returncode != 0:
        return install.stdout, ""
    tests = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SELECT.get(case, [])],
        cwd=rendered.path,
        # The longest suite (digits, every slow test and README command) passed 50 minutes
        # beside another on a loaded 2-core machine; its multi-process tests end within limits
        # of their own (a stalled README command within 180 s), so this only bounds the total.
        timeout=4200,
        # src/ first: the package reads configs/default.yaml beside src/, as in the editable
        # install a user makes; the installed copy shows the project installs.
        PYTHONPATH=os.pathsep.join([str(rendered.path / "src"), str(site)]),
    )
    return install.stdout, tests.stdout + f"\n[exit status {tests.returncode}]"


@pytest.fixture(scope="module")
def suites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future]]:
    """Every case's suite, started in the background; each test waits for its own."""
    # Rendered here, one after another: cookiecutter changes the working directory.
    renders = {}
    for case in sorted(SUITE_RUNS, key=lambda c: c not in SELECT):
        workdir = tmp_path_factory.mktemp(case)
        renders[case] = (render(workdir, **CASES[case]), workdir)
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        futures = {case: pool.submit(run_suite, r, w, case) for case, (r, w) in renders.items()}
        try:
            yield futures
        finally:
            for future in futures.values():
                future.cancel()


@pytest.mark.slow
@pytest.mark.parametrize("case", SUITE_RUNS)
def test_generated_suite_passes(suites: dict[str, Future], case: str) -> None:
    install, tests = suites[case].result()
    assert tests, f"the render did not install:\n{install}"
    assert tests.endswith("[exit status 0]"), tests
    passed = re.search(r"(\d+) passed", tests)
    assert passed and int(passed.group(1)) > 0, tests
