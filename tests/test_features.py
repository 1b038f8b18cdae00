"""The feature questions (deploy, sweep, cluster) and the dependencies they bring.

A feature answered `no` leaves out its files and every mention of it, and what remains still
imports, lints and passes its own tests (test_generated_project.py runs a suite without any).
Whatever the answers, pyproject.toml declares what the project imports and nothing it does not.
"""

import ast
import re
import sys
import tomllib
from functools import cache
from importlib import metadata
from itertools import chain
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from helpers import Render, files, render, ruff, run

FEATURES = ("deploy", "sweep", "cluster")
ALL_OFF = dict.fromkeys(FEATURES, "no")

# What each feature adds; `{package}` is the package folder.
FEATURE_FILES = {
    "deploy": [
        "export.py", "predict.py", "serve.py", "{package}/kit/export.py",
        "{package}/kit/predict.py", "{package}/kit/serve.py", "{package}/kit/inference.py",
        "{package}/inputs.py",
    ],
    "sweep": [
        "sweep.py", "{package}/kit/sweep.py", "{package}/kit/search_space.py",
        "configs/sweep/default.yaml",
    ],
    "cluster": ["scripts/slurm/train.sbatch"],
}  # fmt: skip

# Words only a feature's own files and sections use. With the feature left out, no file of the
# project holds one: no README command or section, no test, import, comment or dependency.
# (SLURM itself stays: Lightning handles its signals in every project; torchrun on one machine
# is a core launcher.)
TRACES = {
    "deploy": re.compile(
        r"\b(export|predict|serve|inference)\.py\b|onnx|litserve|\bdeploy", re.IGNORECASE
    ),
    "sweep": re.compile(r"\bsweep|search_space|optuna", re.IGNORECASE),
    "cluster": re.compile(r"\bsbatch\b|scripts/slurm|--nnodes|--node_rank"),
}

# What each feature's optional extra holds.
EXTRAS = {
    "deploy": {"torch", "onnx", "onnxruntime", "onnxscript", "litserve", "pydantic"},
    "sweep": {"optuna", "optuna-integration"},
}

# lightning[pytorch-extra] brings these; the project imports none of them.
UNUSED = {"rich", "hydra-core", "omegaconf", "tensorboardx", "bitsandbytes", "jsonnet"}


def on(rendered: Render, feature: str) -> bool:
    return rendered.answers[feature] == "yes"


def pyproject(rendered: Render) -> dict:
    return tomllib.loads((rendered.path / "pyproject.toml").read_text())["project"]


def requirements(rendered: Render) -> list[Requirement]:
    """Every requirement of the project and its extras, but the extras' own reference to it."""
    project = pyproject(rendered)
    lines = [*project["dependencies"], *chain(*project["optional-dependencies"].values())]
    found = [Requirement(line) for line in lines]
    return [req for req in found if canonicalize_name(req.name) != project["name"]]


def test_feature_files_follow_the_answers(rendered: Render) -> None:
    package = str(rendered.package.relative_to(rendered.path))
    for feature, paths in FEATURE_FILES.items():
        for path in paths:
            exists = (rendered.path / path.format(package=package)).is_file()
            assert exists == on(rendered, feature), f"{feature}={rendered.answers[feature]}: {path}"


def test_features_left_out_leave_no_mention(rendered: Render) -> None:
    left_out = [feature for feature in FEATURES if not on(rendered, feature)]
    found = []
    for path in files(rendered.path):
        if not path.is_file():
            continue
        relative = path.relative_to(rendered.path)
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            for feature in left_out:
                if TRACES[feature].search(line) or TRACES[feature].search(str(relative)):
                    found.append(f"{feature}=no: {relative}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_readme_and_extras_follow_the_features(rendered: Render) -> None:
    readme = (rendered.path / "README.md").read_text()
    assert ("\n## Deploy\n" in readme) == on(rendered, "deploy")
    assert ("\n## Hyperparameter search\n" in readme) == on(rendered, "sweep")
    assert ("sbatch scripts/slurm/train.sbatch" in readme) == on(rendered, "cluster")
    assert "python evaluate.py --ckpt_path last" in readme  # evaluation is no feature

    project = pyproject(rendered)
    chosen = [feature for feature in EXTRAS if on(rendered, feature)]
    extras = project["optional-dependencies"]
    # timm is an extra in every render: a backbone by choice at run time, not a feature.
    assert set(extras) == {"dev", "timm", *chosen}
    assert {Requirement(line).name for line in extras["timm"]} == {"timm"}
    for feature in chosen:
        assert {Requirement(line).name for line in extras[feature]} == EXTRAS[feature]
    # dev installs what the tests import: timm's extra and those of the features they test.
    itself = [req for req in map(Requirement, extras["dev"]) if req.name == project["name"]]
    assert [req.extras for req in itself] == [{"timm", *chosen}]


def test_dependencies_are_lightning_without_its_extras(rendered: Render) -> None:
    project = pyproject(rendered)
    required = {
        canonicalize_name(req.name): req for req in map(Requirement, project["dependencies"])
    }
    assert required["lightning"].extras == set()
    # LightningCLI reads the model's and data's signatures only with this extra.
    assert "signatures" in required["jsonargparse"].extras
    assert ("tensorboard" in required) == (rendered.answers["logger"] == "tensorboard")
    names = {canonicalize_name(req.name) for req in requirements(rendered)}
    assert not names & UNUSED


@cache
def installed_by(declared: tuple[str, ...]) -> frozenset[str]:
    """The distributions the requirements install, with theirs, as installed here."""
    found: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(line) for line in declared]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        found.add(name)
        try:
            requires = metadata.distribution(req.name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            sub = Requirement(line)
            if sub.marker is None or any(
                sub.marker.evaluate({"extra": extra}) for extra in {"", *req.extras}
            ):
                todo.append(sub)
    return frozenset(found)


def imported_modules(root: Path) -> dict[str, str]:
    """Top-level module -> the first file importing it, for every absolute import under root."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(root)))
    return found


def test_every_import_is_installed_by_a_declared_dependency(rendered: Render) -> None:
    declared = installed_by(tuple(str(req) for req in requirements(rendered)))
    providers = metadata.packages_distributions()
    # The project's own modules: its package, its scripts, and the tests' helper modules.
    own = {rendered.answers["package_name"]} | {
        path.stem for path in rendered.path.rglob("*.py") if rendered.package not in path.parents
    }
    missing = []
    for module, where in imported_modules(rendered.path).items():
        if module in own or module in sys.stdlib_module_names:
            continue
        names = {canonicalize_name(name) for name in providers.get(module, [])}
        if not names & declared:
            missing.append(f"{module} (imported in {where}; provided by {sorted(names)})")
    assert not missing, "imported, but no declared dependency installs it:\n" + "\n".join(missing)


@pytest.fixture(scope="module")
def without_features(tmp_path_factory: pytest.TempPathFactory) -> Render:
    return render(tmp_path_factory.mktemp("without-features"), **ALL_OFF)


def test_project_without_features_imports_every_module(without_features: Render) -> None:
    package = without_features.answers["package_name"]
    modules = [f"{package}.{path.stem}" for path in without_features.package.glob("*.py")]
    scripts = [path.stem for path in without_features.path.glob("*.py")]
    # A fresh interpreter: nothing another render imported before can stand in for a module.
    code = (
        "import importlib, sys\n"
        f"for name in {[*modules, *scripts]!r}:\n"
        "    print(name, importlib.import_module(name).__file__)\n"
    )
    result = run(
        [sys.executable, "-c", code],
        cwd=without_features.path,
        PYTHONPATH=str(without_features.path / "src"),
    )
    assert result.returncode == 0, result.stdout
    for line in result.stdout.splitlines():
        if line.startswith(f"{package}."):
            assert Path(line.split()[1]).is_relative_to(without_features.package), line


@pytest.mark.parametrize(
    "command", [("check", "."), ("format", "--check", ".")], ids=["check", "format"]
)
def test_project_without_features_is_ruff_clean(
    without_features: Render, command: tuple[str, ...]
) -> None:
    result = run(ruff(*command), cwd=without_features.path)
    assert result.returncode == 0, result.stdout


def package_lines(rendered: Render) -> dict[str, int]:
    """Lines of each module of the package, the library's (kit/) too."""
    return {
        str(path.relative_to(rendered.package)): len(path.read_text().splitlines())
        for path in sorted(rendered.package.rglob("*.py"))
    }


def test_features_left_out_shrink_the_package(
    without_features: Render, tmp_path: Path, record_property
) -> None:
    full = package_lines(render(tmp_path))
    lean = package_lines(without_features)
    feature_modules = {
        path.removeprefix("{package}/")
        for paths in FEATURE_FILES.values()
        for path in paths
        if path.startswith("{package}/")
    }
    assert set(lean) == set(full) - feature_modules
    assert sum(lean.values()) <= sum(full.values()) - sum(full[name] for name in feature_modules)
    record_property("package_lines_all_features", sum(full.values()))
    record_property("package_lines_no_features", sum(lean.values()))
    print(f"package lines: {sum(full.values())} with every feature, {sum(lean.values())} without")
