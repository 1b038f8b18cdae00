"""Every render: fully rendered, only the chosen options' files, lint-clean, importable."""

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from helpers import LEFTOVER, Render, files, import_cli, render, ruff, run

# Jinja left behind: `{{`, `{%`, `{#` or the word cookiecutter. GitHub Actions
# expressions `${{ ... }}` are meant to stay.

LICENSE_TITLES = {
    "MIT": "MIT License",
    "Apache-2.0": "Apache License",
    "BSD-3-Clause": "BSD 3-Clause License",
}

# What data.py holds for each dataset, as a pattern no other dataset's data.py matches.
DATASET_MARKERS = {
    "digits": r"\bload_digits\b",
    "mnist": r"(?<![\w-])MNIST\b",  # not Fashion-MNIST nor FashionMNIST
    "fashion_mnist": r"\bFashionMNIST\b",
    "cifar10": r"\bCIFAR10\b",
    "image_folder": r"\bImageFolder\b",
}


def test_no_template_syntax_left(rendered: Render) -> None:
    leftovers = []
    for path in files(rendered.path):
        relative = path.relative_to(rendered.path)
        if LEFTOVER.search(str(relative).encode()):
            leftovers.append(f"{relative} (in its name)")
        if path.is_file():
            for number, line in enumerate(path.read_bytes().splitlines(), start=1):
                if LEFTOVER.search(line):
                    leftovers.append(f"{relative}:{number}: {line.decode(errors='replace')}")
    assert not leftovers, "unrendered template syntax:\n" + "\n".join(leftovers)


def test_variant_folders_are_pruned(rendered: Render) -> None:
    package = rendered.package.relative_to(rendered.path)
    for folder in ("licenses", package / "datasets", "tests/datasets"):
        assert not (rendered.path / folder).exists(), f"{folder}/ should have been removed"


def test_chosen_dataset_files(rendered: Render) -> None:
    data = rendered.package / "data.py"
    assert data.is_file()
    assert (rendered.path / "tests" / "conftest.py").is_file()
    source = data.read_text()
    for dataset, marker in DATASET_MARKERS.items():
        found = re.search(marker, source) is not None
        assert found == (dataset == rendered.answers["dataset"]), (
            f"data.py for dataset {rendered.answers['dataset']!r} "
            f"{'lacks' if not found else 'mentions'} {dataset}'s {marker!r}"
        )


def test_batch_augmentation_only_for_datasets_held_in_memory(rendered: Render) -> None:
    in_memory = rendered.answers["dataset"] != "image_folder"
    for path in (
        rendered.package / "batch_augment.py",
        rendered.path / "tests" / "test_batch_augment.py",
    ):
        assert path.is_file() == in_memory, path


def test_shards_only_for_image_folders(rendered: Render) -> None:
    folder = rendered.answers["dataset"] == "image_folder"
    for path in (
        rendered.path / "convert.py",
        rendered.package / "shards.py",
        rendered.path / "configs" / "data" / "shards.yaml",
        rendered.package / "image_files.py",
    ):
        assert path.is_file() == folder, path
    requirements = tomllib.loads((rendered.path / "pyproject.toml").read_text())["project"]
    assert any(r.startswith("litdata") for r in requirements["dependencies"]) == folder


def test_every_rendered_file_is_committed_by_git(rendered: Render, tmp_path: Path) -> None:
    """The project's own .gitignore ignores nothing it ships (configs/data/ is not data/)."""
    copy = tmp_path / "project"
    shutil.copytree(rendered.path, copy)
    subprocess.run(["git", "init", "-q", str(copy)], check=True)
    status = subprocess.run(
        ["git", "-C", str(copy), "status", "--porcelain", "--ignored", "--untracked-files=all"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert not [line for line in status.splitlines() if line.startswith("!!")], status


def test_license(rendered: Render) -> None:
    license_file = rendered.path / "LICENSE"
    chosen = rendered.answers["license"]
    project = tomllib.loads((rendered.path / "pyproject.toml").read_text())["project"]
    if chosen == "none":
        assert not license_file.exists()
        assert "license" not in project
        return
    text = license_file.read_text()
    assert LICENSE_TITLES[chosen] in text
    assert rendered.answers["author_name"] in text
    for other, title in LICENSE_TITLES.items():
        if other != chosen:
            assert title not in text
    assert project["license"] == chosen


def test_github_actions(rendered: Render) -> None:
    github = rendered.path / ".github"
    if rendered.answers["github_actions"] == "yes":
        assert list(github.glob("workflows/*.yml")), "no workflow under .github/workflows/"
    else:
        assert not github.exists()


def test_python_version(rendered: Render) -> None:
    version = rendered.answers["python_version"]
    settings = tomllib.loads((rendered.path / "pyproject.toml").read_text())
    assert settings["project"]["requires-python"] == f">={version}"
    assert settings["tool"]["ruff"]["target-version"] == "py" + version.replace(".", "")


def test_project_metadata(rendered: Render) -> None:
    project = tomllib.loads((rendered.path / "pyproject.toml").read_text())["project"]
    assert project["name"] == rendered.answers["project_slug"] == rendered.path.name
    assert project["authors"] == [
        {"name": rendered.answers["author_name"], "email": rendered.answers["author_email"]}
    ]


@pytest.mark.parametrize(
    "command", [("check", "."), ("format", "--check", ".")], ids=["check", "format"]
)
def test_ruff_clean(rendered: Render, command: tuple[str, ...]) -> None:
    result = run(ruff(*command), cwd=rendered.path)
    assert result.returncode == 0, result.stdout


def test_cli_imports(rendered: Render) -> None:
    cli = import_cli(rendered)
    assert Path(cli.__file__).is_relative_to(rendered.path / "src")


def test_entry_scripts_import_under_their_main_guard(rendered: Render) -> None:
    """Loader workers (and DDP's spawned processes) run the main script's top level again: an
    import there would make every run's workers import Lightning and the training code."""
    for script in sorted(rendered.path.glob("*.py")):
        for node in ast.parse(script.read_text()).body:
            docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            standard = isinstance(node, ast.Import) and all(
                alias.name in sys.stdlib_module_names for alias in node.names
            )
            guard = isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
            assert docstring or standard or guard, f"{script.name}:{node.lineno} runs in workers"


def test_output_path_with_spaces(tmp_path) -> None:
    rendered = render(tmp_path / "my projects" / "café 2")
    assert rendered.path.parent == tmp_path / "my projects" / "café 2" / "out"
    assert not (rendered.path / "licenses").exists(), "the post-generation hook did not run"
    assert (rendered.path / "LICENSE").is_file()
    cli = import_cli(rendered)
    assert Path(cli.__file__).is_relative_to(rendered.path / "src")


def readme_commands(readme: Path) -> list[str]:
    """The commands of the README's bash blocks, continuations joined, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", readme.read_text(), re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    commands = [" ".join(line.split("  #")[0].split()) for line in lines]
    return [command for command in commands if command and not command.startswith("#")]


def test_readme_commands_fit_the_chosen_logger_and_dataset(rendered: Render) -> None:
    commands = readme_commands(rendered.path / "README.md")
    # Only the TensorBoard logger writes event files for `tensorboard --logdir`.
    viewers = {"tensorboard": "tensorboard ", "mlflow": "mlflow ui", "wandb": "wandb sync"}
    for logger, viewer in viewers.items():
        shown = [c for c in commands if viewer in c]
        assert bool(shown) == (rendered.answers["logger"] == logger), (logger, shown)
    # A new run needs the data's location unless the dataset downloads itself offline (digits)
    # or a run's own config.yaml (a resume, a sweep's best trial) already holds it.
    needs_root = rendered.answers["dataset"] != "digits"
    new_runs = [
        command
        for command in commands
        if re.search(r"\b(train|sweep|repeat)\.py\b", command)
        and "runs/" not in command
        and "--ckpt_path" not in command
    ]
    assert new_runs
    for command in new_runs:
        # Or shards converted from the image folder (--data.input_dir).
        assert ("--data.root" in command or "--data.input_dir" in command) == needs_root, command
    # Run folders are numbered per experiment: an example names no particular one (a trial's
    # or a repeat's run has a folder of its own, whose first run is version_0).
    assert not [c for c in commands if "version_0" in c and not re.search("sweeps|repeats", c)]


def test_readme_maps_every_module(rendered: Render) -> None:
    """The README's "where is what" names every module of the package that was rendered, the
    library's (kit/) too."""
    package = rendered.path / "src" / rendered.answers["package_name"]
    table = (rendered.path / "README.md").read_text().split("## Install")[0]
    named = set(re.findall(r"`(?:src/\w+/)?(?:kit/)?(\w+\.py)`", table))
    modules = {path.name for path in [*package.glob("*.py"), *package.glob("kit/*.py")]}
    modules -= {"__init__.py"}
    assert modules <= named, sorted(modules - named)
    scripts = {path.name for path in rendered.path.glob("*.py")}
    assert named <= modules | scripts, sorted(named - modules - scripts)  # nothing left over
