"""The library trains a project of another kind: points, not images (tests/toy.py).

What the library does with a project's model and data (fit, test, checkpoints, the run
folder, --monitor, resume, repeats, the runs table) takes nothing of images; the project
hands over its model class and its defaults file, as the entry scripts hand over this one's.
"""

import ast
import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import toy

from {{ cookiecutter.package_name }}.kit import project as handover
from {{ cookiecutter.package_name }}.kit.cli import project_defaults
from {{ cookiecutter.package_name }}.kit.repeat import run as repeat
from {{ cookiecutter.package_name }}.kit.results import table
from {{ cookiecutter.package_name }}.kit.train import main

KIT = Path(handover.__file__).parent
IMAGE_LIBRARIES = {"PIL", "torchvision", "timm", "cv2", "skimage"}


@pytest.fixture
def points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The toy project handed over in place of this one, run in tmp_path."""
    defaults = toy.write_defaults(project_defaults(), tmp_path)
    monkeypatch.chdir(tmp_path)
    previous = handover.handed_over()
    handover.use(handover.Project(model=toy.PointClassifier, defaults=defaults))
    yield tmp_path
    handover.use(previous)


def test_a_project_of_points_trains_tests_and_keeps_its_run(points: Path) -> None:
    metrics = main(["--monitor", "val/acc"])
    run = points / "runs" / "default" / "version_0"
    assert metrics["test/acc"] > 0.9  # three well-separated clouds of points
    assert json.loads((run / "test_metrics.json").read_text())["test/acc"] == metrics["test/acc"]
    assert json.loads((run / "val_metrics.json").read_text())["val/acc"] > 0.9
    assert len(list((run / "checkpoints").glob("epoch*-val_acc=*.ckpt"))) == 1  # by --monitor
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert (run / "plots" / "confusion_matrix.png").is_file()
    # Resumed from its last checkpoint, the run goes on in its own folder.
    main(["--ckpt_path", "last", "--max_epochs", "4"])
    assert sorted(path.name for path in (points / "runs" / "default").iterdir()) == ["version_0"]


def test_its_monitor_is_what_its_model_logs(points: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--monitor", "val/f1"])  # the image project's model logs it; this one does not
    assert str(exit_info.value.code) == (
        "error: --monitor val/f1 is not a validation metric the model logs; accepted: "
        "val/loss, val/acc"
    )


def test_its_repeats_summarise_and_its_runs_make_a_table(points: Path) -> None:
    summary = repeat(["--seeds", "2", "--max_epochs", "2"])
    assert summary["metrics"]["test/acc"]["n"] == 2
    (row,) = csv.DictReader(io.StringIO(table([points / "runs"], "test/acc", "csv")))
    assert row["runs"] == "2"
    assert float(row["test/acc"].split(" ± ")[0]) > 0.9


def library_imports(module: Path) -> set[str]:
    """The top-level packages a module of the library imports (anywhere in it)."""
    found = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def training_modules() -> set[Path]:
    """The library's modules that train.py, repeat.py and results.py import, transitively."""
    seen: set[Path] = set()
    todo = [KIT / name for name in ("train.py", "repeat.py", "results.py")]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                todo.append(KIT / f"{node.module}.py")
    return seen


def test_the_library_that_trains_imports_no_image_library() -> None:
    found = {
        module.name: sorted(library_imports(module) & IMAGE_LIBRARIES)
        for module in training_modules()
    }
    assert {name: found_ for name, found_ in found.items() if found_} == {}
