"""The pre-generation hook: bad answers stop the render early and clearly."""

import json

import pytest
from cookiecutter.exceptions import FailedHookException
from cookiecutter.main import cookiecutter

from helpers import QUESTIONS, REPO, render

# answers, the question named, the value named, a word of what is accepted
BAD_ANSWERS = {
    "name-starts-with-digit": ({"project_name": "2fast"}, "package_name", "2fast", "letter"),
    "name-3d-scans": ({"project_name": "3D Scans"}, "package_name", "3d_scans", "letter"),
    "package-shadows-torch": ({"package_name": "torch"}, "package_name", "torch", "shadow"),
    "package-is-keyword": ({"package_name": "class"}, "package_name", "class", "keyword"),
    "package-is-stdlib": ({"package_name": "json"}, "package_name", "json", "shadow"),
    "package-is-an-entry-script": ({"package_name": "serve"}, "package_name", "serve", "shadow"),
    "package-shadows-optuna": ({"package_name": "optuna"}, "package_name", "optuna", "shadow"),
    "email": ({"author_email": "not-an-email"}, "author_email", "not-an-email", "@"),
    "slug": ({"project_slug": "Bad Slug"}, "project_slug", "Bad Slug", "lowercase"),
}


@pytest.mark.parametrize(
    ("answers", "question", "value", "accepted"), BAD_ANSWERS.values(), ids=BAD_ANSWERS.keys()
)
def test_bad_answer_is_rejected(
    tmp_path, capfd, answers: dict[str, str], question: str, value: str, accepted: str
) -> None:
    with pytest.raises(FailedHookException):
        render(tmp_path, **answers)
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {lines}"
    (line,) = lines
    assert question in line
    assert value in line
    assert accepted.lower() in line.lower()
    assert list((tmp_path / "out").iterdir()) == [], "a rejected render left files behind"


@pytest.mark.parametrize("question", QUESTIONS)
def test_bad_choice_in_a_replayed_context_is_rejected(tmp_path, capfd, question: str) -> None:
    # Prompts and --no-input offer only the listed choices; a replay file (or the answers cruft
    # keeps in .cruft.json) reaches the hooks unchecked, so the pre-generation hook checks them.
    replay = render(tmp_path).context
    replay["cookiecutter"][question] = "maybe"
    replay_file = tmp_path / "replay.json"
    replay_file.write_text(json.dumps(replay))
    output = tmp_path / "again"
    output.mkdir()
    capfd.readouterr()
    with pytest.raises(FailedHookException):
        cookiecutter(
            str(REPO),
            replay=str(replay_file),
            output_dir=str(output),
            config_file=str(tmp_path / "cookiecutter" / "config.yaml"),
        )
    (line,) = capfd.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {question} 'maybe' is not one of: ")
    assert all(value in line for value in QUESTIONS[question])
    assert list(output.iterdir()) == [], "a rejected render left files behind"


@pytest.mark.parametrize(
    ("project_name", "slug", "package"),
    [
        ("Café Vision", "cafe-vision", "cafe_vision"),
        ("my-project 2", "my-project-2", "my_project_2"),
        ("Scans in 3D", "scans-in-3d", "scans_in_3d"),
    ],
)
def test_awkward_names_derive_valid_names(
    tmp_path, project_name: str, slug: str, package: str
) -> None:
    rendered = render(tmp_path, project_name=project_name)
    assert rendered.answers["project_slug"] == slug
    assert rendered.answers["package_name"] == package
    assert rendered.path == tmp_path / "out" / slug
    assert (rendered.path / "src" / package / "model.py").is_file()
    assert (rendered.path / "src" / package / "kit" / "cli.py").is_file()
