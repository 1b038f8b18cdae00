"""The template repository's own CI workflow: it parses, and its commands exist and work."""

import json
import shlex
import sys
import tomllib
from pathlib import Path

import yaml

from helpers import QUESTIONS, REPO, run

WORKFLOW = REPO / ".github" / "workflows" / "test.yml"


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def load() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def commands(job: dict) -> list[str]:
    return [
        line.strip()
        for step in job["steps"]
        for line in step.get("run", "").splitlines()
        if line.strip()
    ]


def test_template_job_runs_make_test_lint_and_docs() -> None:
    job = load()["jobs"]["template"]
    assert {"make test", "make lint", "make docs"} <= set(commands(job))
    for target in ("test", "lint", "docs"):
        dry = run(["make", "-n", target], cwd=REPO)
        assert dry.returncode == 0, dry.stdout
    # The template's tests need 3.11 (tomllib); every supported version from there up runs.
    pythons = job["strategy"]["matrix"]["python-version"]
    expected = [v for v in QUESTIONS["python_version"] if version(v) >= (3, 11)]
    assert sorted(pythons, key=version) == sorted(expected, key=version)


def test_project_job_covers_every_python_version_answer(tmp_path: Path) -> None:
    job = load()["jobs"]["project"]
    pythons = job["strategy"]["matrix"]["python-version"]
    assert sorted(pythons) == sorted(QUESTIONS["python_version"])
    lines = commands(job)
    assert "pytest" in lines
    assert {"ruff check .", "ruff format --check ."} <= set(lines)

    # The render command as the workflow runs it (from the repository root, here into
    # tmp_path: the project with the library's tests), and the folder its later steps work in.
    (render,) = [line for line in lines if line.startswith("python tests/render_with_library")]
    render = render.replace("${{ matrix.python-version }}", pythons[0])
    script, output, *answers = shlex.split(render)[1:]
    config = tmp_path / "cookiecutter.yaml"
    config.write_text(f"replay_dir: {json.dumps(str(tmp_path / 'replay'))}\n")
    result = run(
        [sys.executable, str(REPO / script), str(tmp_path / output), *answers],
        cwd=tmp_path,
        COOKIECUTTER_CONFIG=str(config),
    )
    assert result.returncode == 0, result.stdout
    folders = {step.get("working-directory") for step in job["steps"]} - {None}
    assert folders
    for folder in folders:
        settings = tomllib.loads((tmp_path / folder / "pyproject.toml").read_text())
        assert settings["project"]["requires-python"] == f">={pythons[0]}"
