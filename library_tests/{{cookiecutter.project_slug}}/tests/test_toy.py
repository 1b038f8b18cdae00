"""The library trains a project of another kind: points, not images (tests/toy.py).

What the library does with a project's model and data (fit, test, checkpoints, the run
folder, --monitor, resume, repeats, the runs table{% if cookiecutter.deploy == "yes" %}, export, prediction, serving{% endif %}) takes nothing of
images; the project hands over its model class, its defaults file and its inputs module
(toy_inputs.py), as the entry scripts hand over this one's.
"""

import ast
{%- if cookiecutter.deploy == "yes" %}
import base64
{%- endif %}
import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import toy
{%- if cookiecutter.deploy == "yes" %}
from fastapi import HTTPException
{%- endif %}

from {{ cookiecutter.package_name }}.kit import project as handover
from {{ cookiecutter.package_name }}.kit.cli import project_defaults
from {{ cookiecutter.package_name }}.kit.errors import ConfigError
{%- if cookiecutter.deploy == "yes" %}
from {{ cookiecutter.package_name }}.kit.export import main as export
from {{ cookiecutter.package_name }}.kit.inference import metadata_path
from {{ cookiecutter.package_name }}.kit.predict import main as predict
{%- endif %}
from {{ cookiecutter.package_name }}.kit.repeat import run as repeat
from {{ cookiecutter.package_name }}.kit.results import table
{%- if cookiecutter.deploy == "yes" %}
from {{ cookiecutter.package_name }}.kit.serve import ClassifierAPI, InputRequest
{%- endif %}
from {{ cookiecutter.package_name }}.kit.train import main

KIT = Path(handover.__file__).parent
IMAGE_LIBRARIES = {"PIL", "torchvision", "timm", "cv2", "skimage"}


@pytest.fixture
def points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The toy project handed over in place of this one, run in tmp_path."""
    defaults = toy.write_defaults(project_defaults(), tmp_path)
    monkeypatch.chdir(tmp_path)
    previous = handover.handed_over()
    handover.use(
        handover.Project(model=toy.PointClassifier, defaults=defaults, inputs="toy_inputs")
    )
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


def test_its_inputs_module_is_named_absolutely() -> None:
    for given in (".toy_inputs", 5, ""):
        with pytest.raises(ConfigError, match="give the inputs module or its absolute name"):
            handover.Project(model=toy.PointClassifier, inputs=given)
    with pytest.raises(ConfigError, match="inputs module toy lacks FIELD, ONE_FILE"):
        handover.Project(model=toy.PointClassifier, inputs=toy)


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


def test_the_library_imports_no_image_library() -> None:
    modules = sorted(KIT.glob("*.py"))
    assert {"train.py", "repeat.py", "results.py"} <= {module.name for module in modules}
    found = {module.name: sorted(library_imports(module) & IMAGE_LIBRARIES) for module in modules}
    assert {name: found_ for name, found_ in found.items() if found_} == {}
{%- if cookiecutter.deploy == "yes" %}


def test_a_project_of_points_exports_predicts_and_serves(points: Path) -> None:
    main([])
    (artifact,) = export(["--ckpt_path", "best", "--format", "onnx"])
    metadata = json.loads(metadata_path(artifact).read_text())
    assert (metadata["inputs"], metadata["preprocessing"]) == ("toy_inputs", {})
    folder = points / "points"
    folder.mkdir()
    for name, text in [("a", "-2 -2"), ("b", "2 -2.5"), ("c", "0.1 2.4"), ("z", "hello")]:
        (folder / f"{name}.txt").write_text(text)
    assert predict(["--model", str(artifact), str(folder), "--output", "rows.json"]) == 1
    rows = json.loads((points / "rows.json").read_text())
    assert [row["class"] for row in rows] == ["south-west", "south-east", "north", None]
    assert rows[-1]["error"] == "not two numbers: b'hello'"

    api = ClassifierAPI(artifact)
    api.setup("cpu")

    def served(body: dict) -> dict:
        return api.encode_response(api.predict(api.decode_request(InputRequest(**body))))

    assert served({"point": base64.b64encode(b"2 -2").decode()})["class"] == "south-east"
    for body, status in [({"image": "x"}, 422), ({"point": "x!"}, 400), ({"point": "aGk="}, 415)]:
        with pytest.raises(HTTPException) as refused:
            served(body)
        assert refused.value.status_code == status
    with pytest.raises(HTTPException) as refused:
        served({"point": base64.b64encode(b"1 " * 60).decode()})
    assert (refused.value.status_code, refused.value.detail) == (
        413, "a point is at most 100 characters"
    )  # fmt: skip
{%- endif %}
