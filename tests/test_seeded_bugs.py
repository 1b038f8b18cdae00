"""A bug seeded in the data, the network, the penalty or the metric of a default render fails
the project's own test about that thing (which passes without the bug: the render's suite runs
in test_generated_project.py)."""

import shutil
import sys
from pathlib import Path

import pytest

from helpers import Render, render, run

# name: (file of the package, text, the text with the bug, the test that must fail)
BUGS = {
    "data: the normalisation left out": (
        "data.py",
        "v2.Compose([v2.ToDtype(torch.float32), v2.Normalize(MEAN, STD)])",
        "v2.Compose([v2.ToDtype(torch.float32)])",
        "tests/test_data.py::test_inputs_are_normalised_floats_not_raw_pixels",
    ),
    "network: a stage's blocks replace the first block": (
        "backbones.py",
        "            layers += [\n                nn.MaxPool2d(2),",
        "            layers = [\n                nn.MaxPool2d(2),",
        "tests/test_model.py::test_model_returns_logits_and_predict_returns_probabilities",
    ),
    "penalty: L1 instead of L2": (
        "backbones.py",
        "self.penalty * self.weight.square().sum()",
        "self.penalty * self.weight.abs().sum()",
        "tests/test_model.py::test_a_penalty_that_a_module_carries_joins_the_gradient",
    ),
    "metric: F1 averaged over images, not classes": (
        "model.py",
        'MulticlassF1Score(num_classes, average="macro")',
        'MulticlassF1Score(num_classes, average="micro")',
        "tests/test_model.py::test_validation_logs_the_monitored_metric_and_the_metrics_are_right",
    ),
}


@pytest.fixture(scope="module")
def default_render(tmp_path_factory: pytest.TempPathFactory) -> Render:
    return render(tmp_path_factory.mktemp("default"))


@pytest.mark.slow
@pytest.mark.parametrize("bug", BUGS)
def test_a_seeded_bug_fails_the_test_about_it(
    default_render: Render, tmp_path: Path, bug: str
) -> None:
    file, text, broken, expected = BUGS[bug]
    project = tmp_path / default_render.path.name
    shutil.copytree(default_render.path, project)
    source = project / default_render.package.relative_to(default_render.path) / file
    original = source.read_text()
    assert original.count(text) == 1, f"{file} no longer holds {text!r}"
    source.write_text(original.replace(text, broken))
    tests = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", expected],
        cwd=project,
        PYTHONPATH=str(project / "src"),
    )
    assert tests.returncode == 1, tests.stdout[-4000:]  # tests failed (not a usage error)
    assert f"FAILED {expected}" in tests.stdout, tests.stdout[-4000:]
