"""tests/constraints/lowest.txt pins the default project's lower bounds, no higher and no lower."""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from helpers import REPO, render


def pins(path: Path) -> dict[str, Version]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    pinned = [Requirement(line) for line in lines if "==" in line]
    return {req.name: Version(str(req.specifier).removeprefix("==")) for req in pinned}


def test_lowest_txt_pins_every_lower_bound_of_the_default_project(tmp_path: Path) -> None:
    project = tomllib.loads((render(tmp_path).path / "pyproject.toml").read_text())["project"]
    pinned = pins(REPO / "tests" / "constraints" / "lowest.txt")
    for line in project["dependencies"]:
        requirement = Requirement(line)
        (bound,) = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        assert pinned.get(requirement.name) == bound, f"lowest.txt: {requirement.name}=={bound}"
