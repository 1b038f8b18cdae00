"""The generated project's own test suite passes, for each dataset."""

import json
import re
import sys

import pytest

from helpers import CASES, DATASET_CASES, REPO, render, run

# The oldest Python a project may ask for: every interpreter that runs these tests
# satisfies its requires-python. Each python_version is checked in test_render.py.
OLDEST_PYTHON = min(
    json.loads((REPO / "cookiecutter.json").read_text())["python_version"],
    key=lambda version: tuple(map(int, version.split("."))),
)


@pytest.mark.slow
@pytest.mark.parametrize("case", DATASET_CASES)
def test_generated_suite_passes(tmp_path, case: str) -> None:
    rendered = render(tmp_path, **{**CASES[case], "python_version": OLDEST_PYTHON})
    site = tmp_path / "site"
    # Into a folder of its own: torch and the rest come from this environment, untouched.
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
    install = run([*pip, "--no-index", "--target", str(site), str(rendered.path)], cwd=tmp_path)
    assert install.returncode == 0, install.stdout

    # The digits render also runs its slow tests (launchers, torch.compile); the
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
