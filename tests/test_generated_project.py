"""The generated project's own test suite passes, for each dataset."""

import re
import sys

import pytest

from combinations import missing_values
from helpers import CASES, DATASET_CASES, DEFAULTS, QUESTIONS, render, run

# The renders whose own test suite runs: between them, every value of every question.
SUITE_RUNS = {case: {**DEFAULTS, **CASES[case]} for case in DATASET_CASES}


def test_suite_runs_cover_every_answer() -> None:
    assert missing_values(QUESTIONS, SUITE_RUNS.values()) == {}


@pytest.mark.slow
@pytest.mark.parametrize("case", SUITE_RUNS)
def test_generated_suite_passes(tmp_path, case: str) -> None:
    rendered = render(tmp_path, **CASES[case])
    site = tmp_path / "site"
    # Into a folder of its own: torch and the rest come from this environment, untouched.
    # python_version changes only requires-python and ruff's target (test_render.py checks
    # both), so its code runs under this interpreter whichever version it names.
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
    pip += ["--no-index", "--ignore-requires-python", "--target", str(site)]
    install = run([*pip, str(rendered.path)], cwd=tmp_path)
    assert install.returncode == 0, install.stdout

    # The digits render also runs its slow tests (several processes, torch.compile); the
    # others run their default selection, which covers everything dataset-specific.
    select = ["-m", ""] if case == "digits" else []
    tests = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *select],
        cwd=rendered.path,
        timeout=900,
        PYTHONPATH=str(site),
    )
    assert tests.returncode == 0, tests.stdout
    passed = re.search(r"(\d+) passed", tests.stdout)
    assert passed and int(passed.group(1)) > 0, tests.stdout
