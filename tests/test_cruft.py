"""Projects made with cruft take template updates and keep their own edits."""

import ast
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from helpers import REPO, run

# Modules a hook may import: none of them starts a process, opens a socket or prompts.
SAFE_MODULES = {"keyword", "pathlib", "re", "shutil", "sys"}

# Not part of a template checkout: the environment, builds and tool caches.
NOT_TEMPLATE = shutil.ignore_patterns(
    ".git", ".venv", "build", "__pycache__", ".pytest_cache", ".ruff_cache"
)

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.org",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.org",
    # The user's own git settings (hooks, signing, templates) stay out of the test.
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
}

TEMPLATE_README = REPO / "{{cookiecutter.project_slug}}" / "README.md"
NEWS = "Release notes of the template live in its repository."
USER_CONFIG = "model:\n  learning_rate: 0.01\n"
# A file of each feature that release 2 changes: the change reaches a project with the feature,
# and a project without it stays without the file.
FEATURE_CHANGES = {
    "deploy": "export.py",
    "sweep": "configs/sweep/default.yaml",
    "cluster": "scripts/slurm/train.sbatch",
}
RELEASE_2_LINE = "# Changed in template release 2.\n"


def cruft(*args: str, cwd: Path) -> str:
    result = run([sys.executable, "-m", "cruft", *args], cwd=cwd, **GIT_IDENTITY)
    assert result.returncode == 0, result.stdout
    return result.stdout


def git(*args: str, cwd: Path) -> str:
    result = run(["git", *args], cwd=cwd, **GIT_IDENTITY)
    assert result.returncode == 0, result.stdout
    return result.stdout


def commit_all(repo: Path, message: str) -> None:
    git("add", "-A", cwd=repo)
    git("commit", "-q", "--no-verify", "-m", message, cwd=repo)


def create(template: Path, answers: dict[str, str]) -> Path:
    """`cruft create` from the template repository (beside it, with a cookiecutter cache of its
    own), the project made a git repository with one commit; its path."""
    settings = template.parent / "cookiecutter.yaml"
    settings.write_text(f"cookiecutters_dir: {json.dumps(str(template.parent / 'cache'))}\n")
    cruft(
        "create", str(template), "--no-input", "--output-dir", str(template.parent),
        "--config-file", str(settings), "--extra-context", json.dumps(answers),
        cwd=template.parent,
    )  # fmt: skip
    (project,) = [path for path in template.parent.iterdir() if (path / ".cruft.json").is_file()]
    git("init", "-q", "-b", "main", cwd=project)
    commit_all(project, "New project")
    return project


@pytest.mark.parametrize("hook", sorted((REPO / "hooks").glob("*.py")), ids=lambda p: p.name)
def test_hooks_are_safe_under_cruft(hook: Path) -> None:
    """cruft runs the hooks again on every update: no git, network or prompts in them."""
    tree = ast.parse(hook.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert imported <= SAFE_MODULES, f"{hook.name} imports {imported - SAFE_MODULES}"
    calls = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert not calls & {"input", "exec", "eval", "__import__"}


@pytest.mark.slow
@pytest.mark.parametrize("features", ["yes", "no"], ids=["with-features", "without-features"])
def test_cruft_update_keeps_user_edits(tmp_path: Path, features: str) -> None:
    # Commit 1 of the template.
    template = tmp_path / "template"
    shutil.copytree(REPO, template, ignore=NOT_TEMPLATE)
    git("init", "-q", "-b", "main", cwd=template)
    commit_all(template, "Template release 1")

    answers = {"project_name": "Leaf Lab", "dataset": "digits"}
    project = create(template, answers | dict.fromkeys(FEATURE_CHANGES, features))

    # The user's own edits: a wider first block and a config of their own.
    backbones = project / "src" / "leaf_lab" / "backbones.py"
    original = "layers = [conv_block(in_channels, width)]"
    edited = "layers = [conv_block(in_channels, 2 * width), conv_block(2 * width, width)]"
    assert original in backbones.read_text()
    backbones.write_text(backbones.read_text().replace(original, edited))
    (project / "configs" / "my_experiment.yaml").write_text(USER_CONFIG)
    commit_all(project, "My model and experiment")

    # Commit 2 of the template: a README line and a new config file.
    readme = template / TEMPLATE_README.relative_to(REPO)
    readme.write_text(readme.read_text().replace("## Tests\n", f"## Tests\n\n{NEWS}\n", 1))
    news_config = template / "{{cookiecutter.project_slug}}" / "configs" / "news.yaml"
    news_config.write_text("trainer:\n  max_epochs: 2\n")
    for path in FEATURE_CHANGES.values():
        with (template / "{{cookiecutter.project_slug}}" / path).open("a") as changed:
            changed.write(RELEASE_2_LINE)
    commit_all(template, "Template release 2")
    release_2 = git("rev-parse", "HEAD", cwd=template).strip()

    stale = run([sys.executable, "-m", "cruft", "check"], cwd=project, **GIT_IDENTITY)
    assert stale.returncode != 0, "cruft check passed on a project one release behind"
    cruft("update", "--skip-apply-ask", cwd=project)

    assert NEWS in (project / "README.md").read_text()
    assert (project / "configs" / "news.yaml").read_text() == "trainer:\n  max_epochs: 2\n"
    assert edited in backbones.read_text()
    assert (project / "configs" / "my_experiment.yaml").read_text() == USER_CONFIG
    for path in FEATURE_CHANGES.values():
        if features == "yes":
            assert (project / path).read_text().endswith(RELEASE_2_LINE)
        else:
            assert not (project / path).exists(), f"the update brought back {path}"
    record = json.loads((project / ".cruft.json").read_text())
    assert record["commit"] == release_2
    assert {record["context"]["cookiecutter"][name] for name in FEATURE_CHANGES} == {features}
    cruft("check", cwd=project)

    commit_all(project, "Template release 2")
    # The data tests, and the model tests that train the edited network.
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    tests = run(
        [*pytest, "tests/test_data.py", "tests/test_model.py"],
        cwd=project,
        PYTHONPATH=str(project / "src"),
    )
    assert tests.returncode == 0, tests.stdout


# The last template release before the machinery moved into src/<package>/kit/ (stop 33).
BEFORE_THE_LIBRARY = "05ee919e6af46b265a687b01cd921360e0dc4270"
PRECISION = '                "precision": MulticlassPrecision(num_classes, average="macro"),\n'


@pytest.mark.slow
def test_a_project_from_before_the_library_takes_it_by_cruft_update(tmp_path: Path) -> None:
    """Made before kit/ existed, with a run and an edited model.py: `cruft update` brings the
    library and keeps the edit, the project's tests pass, and the old run's resume is refused
    on one line naming where a class its config.yaml names moved."""
    template = tmp_path / "template"
    template.mkdir()
    archive = run(["git", "archive", "-o", str(tmp_path / "v1.tar"), BEFORE_THE_LIBRARY], REPO)
    assert archive.returncode == 0, f"this test needs the repository's history:\n{archive.stdout}"
    git("init", "-q", "-b", "main", cwd=template)
    run(["tar", "-xf", str(tmp_path / "v1.tar")], cwd=template)
    commit_all(template, "Template release before the library")
    project = create(template, {"project_name": "Old Lab"})
    # The user's edit: one more metric in model.py.
    model = project / "src" / "old_lab" / "model.py"
    f1 = '                "f1": MulticlassF1Score(num_classes, average="macro"),\n'
    source = model.read_text()
    assert f1 in source
    source = source.replace(f1, f1 + PRECISION)
    source = source.replace("MulticlassF1Score\n", "MulticlassF1Score, MulticlassPrecision\n")
    model.write_text(source)
    commit_all(project, "Precision too")
    short = ["--max_epochs", "1", "--trainer.limit_train_batches", "2"]
    short += ["--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1"]
    old_run = run(
        [sys.executable, "train.py", *short], cwd=project, PYTHONPATH=str(project / "src")
    )
    assert old_run.returncode == 0, old_run.stdout[-3000:]

    # The next release: the template as it is now.
    for path in template.iterdir():
        if path.name != ".git":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    shutil.copytree(REPO, template, ignore=NOT_TEMPLATE, dirs_exist_ok=True)
    commit_all(template, "Template release with the library")
    cruft("update", "--skip-apply-ask", cwd=project)
    assert not list(project.rglob("*.rej")), "the update left conflicts"
    # A three-way merge leaves markers instead.
    shipped = [path for path in project.rglob("*") if path.is_file() and ".git" not in path.parts]
    marked = [str(path) for path in shipped if b"\n<<<<<<< " in path.read_bytes()]
    assert not marked, f"the update left conflict markers in {marked}"
    source = model.read_text()
    assert PRECISION in source and "from .kit." in source
    assert (project / "src" / "old_lab" / "kit" / "train.py").is_file()
    assert not (project / "src" / "old_lab" / "callbacks.py").exists()
    commit_all(project, "Template release with the library")
    tests = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        PYTHONPATH=str(project / "src"),
    )
    assert tests.returncode == 0, tests.stdout[-6000:]
    resumed = run(
        [sys.executable, "train.py", "--ckpt_path", "last", *short],
        cwd=project,
        PYTHONPATH=str(project / "src"),
    )
    moved = re.search(
        r"old_lab\.(\w+)\.(\w+) moved: it is old_lab\.kit\.\1\.\2 now", resumed.stdout
    )
    assert resumed.returncode != 0 and moved, resumed.stdout[-3000:]
