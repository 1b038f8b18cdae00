"""The library in every project (src/<package>/kit/): copied as it is, importing nothing of the
project it sits in. The project hands over its model class (kit/project.py); a library that
imported model.py or data.py would break on the first fork that renames them."""

import ast
import sys
from pathlib import Path

import pytest

from helpers import (
    CASES,
    LEFTOVER,
    LIBRARY_CASES,
    LIBRARY_TESTS,
    REPO,
    Render,
    add_library_tests,
    render,
    ruff,
    run,
)

KIT = REPO / "{{cookiecutter.project_slug}}" / "src" / "{{cookiecutter.package_name}}" / "kit"


def outside_imports(source: str) -> list[str]:
    """The imports of a library module that reach out of the library: a relative import above
    its own package (`from ..model import X`, `from .. import data`). An absolute import cannot
    name the project: the library's source holds no template syntax, so not its package name
    (test_the_library_is_copied_as_it_is)."""
    return [
        f"from {'.' * node.level}{node.module or ''} import ..."
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.level > 1
    ]


def test_the_library_imports_nothing_of_the_project() -> None:
    modules = sorted(KIT.glob("*.py"))
    assert len(modules) > 20, f"the library's modules are not in {KIT}"
    found = [
        f"{path.name}: {imported}"
        for path in modules
        for imported in outside_imports(path.read_text())
    ]
    assert not found, "\n".join(found)


def test_the_import_check_sees_an_import_of_the_project() -> None:
    assert outside_imports("from ..model import ImageClassifier\n") == ["from ..model import ..."]
    assert outside_imports("from .. import data\n") == ["from .. import ..."]
    assert not outside_imports("from .errors import ConfigError\nimport torch\n")


def test_the_library_is_copied_as_it_is(rendered: Render) -> None:
    """No template syntax in its source; a render holds the same files, less the modules of
    features answered no."""
    kit = rendered.package / "kit"
    for path in KIT.glob("*.py"):
        text = path.read_text()
        assert "{{" not in text and "{%" not in text, f"template syntax in kit/{path.name}"
        copied = kit / path.name
        if copied.exists():
            assert copied.read_text() == text, f"kit/{path.name} differs from the template's"
    assert {path.name for path in kit.glob("*.py")} <= {path.name for path in KIT.glob("*.py")}
    assert (kit / "cli.py").is_file() and (kit / "train.py").is_file()


def test_no_render_ships_the_library_tests(rendered: Render) -> None:
    shipped = {path.name for path in (rendered.path / "tests").rglob("*.py")}
    library = {path.name for path in LIBRARY_TESTS.rglob("test_*.py")}
    assert len(library) > 10 and not shipped & library, sorted(shipped & library)


@pytest.mark.parametrize("case", LIBRARY_CASES)
def test_the_library_tests_render_and_pass_ruff(tmp_path: Path, case: str) -> None:
    rendered = render(tmp_path, **CASES[case])
    added = add_library_tests(rendered)
    assert "test_train.py" in added and "test_user_paths.py" in added
    tests = rendered.path / "tests"
    leftovers = [str(p) for p in tests.rglob("*.py") if LEFTOVER.search(p.read_bytes())]
    assert not leftovers, leftovers
    for command in (("check", "tests"), ("format", "--check", "tests")):
        result = run(ruff(*command), cwd=rendered.path)
        assert result.returncode == 0, result.stdout


def test_ci_renders_a_project_with_the_library_tests(tmp_path: Path) -> None:
    script = REPO / "tests" / "render_with_library_tests.py"
    done = run([sys.executable, str(script), str(tmp_path), "project_slug=lean", "deploy=no"], REPO)
    assert done.returncode == 0, done.stdout
    tests = {path.name for path in (tmp_path / "lean" / "tests").glob("*.py")}
    assert {"test_model.py", "test_train.py", "test_user_paths.py", "logged.py"} <= tests
    assert "test_deploy.py" not in tests
