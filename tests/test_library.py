"""The library in every project (src/<package>/kit/): copied as it is, importing nothing of the
project it sits in. The project hands over its model class (kit/project.py); a library that
imported model.py or data.py would break on the first fork that renames them."""

import ast

from helpers import REPO, Render

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
