"""The pre-generation hook: bad answers stop the render early and clearly."""

import pytest
from cookiecutter.exceptions import FailedHookException

from helpers import render

# answers, the question named, the value named, a word of what is accepted
BAD_ANSWERS = {
    "name-starts-with-digit": ({"project_name": "2fast"}, "package_name", "2fast", "letter"),
    "name-3d-scans": ({"project_name": "3D Scans"}, "package_name", "3d_scans", "letter"),
    "package-shadows-torch": ({"package_name": "torch"}, "package_name", "torch", "shadow"),
    "package-is-keyword": ({"package_name": "class"}, "package_name", "class", "keyword"),
    "package-is-stdlib": ({"package_name": "json"}, "package_name", "json", "shadow"),
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
    assert (rendered.path / "src" / package / "cli.py").is_file()
