"""The generated project's CI workflow and pre-commit hooks parse, and pass on the render."""

import re
import shlex
import tomllib

import yaml

from helpers import Render, ruff, run

RUFF_PRE_COMMIT = "https://github.com/astral-sh/ruff-pre-commit"

# What each pre-commit hook runs, in the form that reports instead of changing files.
HOOK_COMMANDS = {"ruff-check": ["check"], "ruff-format": ["format", "--check"]}


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


def run_lines(workflow: dict) -> list[str]:
    """Every shell line the workflow's steps run."""
    lines = []
    for job in workflow["jobs"].values():
        for step in job["steps"]:
            lines += [line.strip() for line in step.get("run", "").splitlines() if line.strip()]
    return lines


def test_ci_workflow_lints_and_tests(rendered: Render) -> None:
    workflows = rendered.path / ".github" / "workflows"
    if rendered.answers["github_actions"] != "yes":
        assert not workflows.exists()
        return
    workflow = yaml.safe_load((workflows / "ci.yml").read_text())
    (job,) = workflow["jobs"].values()
    (setup,) = [step for step in job["steps"] if step.get("uses", "").startswith("actions/setup")]
    assert setup["with"]["python-version"] == rendered.answers["python_version"]

    lines = run_lines(workflow)
    assert 'pytest -m ""' in lines  # the slow tests too
    lint = [shlex.split(line) for line in lines if line.startswith("ruff ")]
    assert {command[1] for command in lint} == {"check", "format"}
    for command in lint:
        result = run(ruff(*command[1:]), cwd=rendered.path)
        assert result.returncode == 0, f"{shlex.join(command)}:\n{result.stdout}"


def test_pre_commit_runs_ruff(rendered: Render) -> None:
    config = yaml.safe_load((rendered.path / ".pre-commit-config.yaml").read_text())
    (repo,) = config["repos"]
    assert repo["repo"] == RUFF_PRE_COMMIT
    dev = tomllib.loads((rendered.path / "pyproject.toml").read_text())["project"]
    (ruff_bound,) = [dep for dep in dev["optional-dependencies"]["dev"] if dep.startswith("ruff")]
    assert version(repo["rev"]) >= version(ruff_bound), (
        "pre-commit's ruff is older than the dev one"
    )

    assert {hook["id"] for hook in repo["hooks"]} == set(HOOK_COMMANDS)
    for hook in repo["hooks"]:
        args = [arg for arg in hook.get("args", []) if arg != "--fix"]
        command = ruff(*HOOK_COMMANDS[hook["id"]], *args, ".")
        result = run(command, cwd=rendered.path)
        assert result.returncode == 0, f"{hook['id']}:\n{result.stdout}"


def test_readme_explains_template_updates(rendered: Render) -> None:
    readme = (rendered.path / "README.md").read_text()
    section = readme.split("## Updating from the template\n", 1)[1].split("\n## ", 1)[0]
    for command in ("cruft check", "cruft update", "cruft link"):
        assert command in section, f"the README's update section does not explain {command}"
