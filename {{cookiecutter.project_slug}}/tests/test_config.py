"""configs/default.yaml holds every default of train.py, each key with a comment."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from {{ cookiecutter.package_name }}.kit.train import main

DEFAULTS = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"
PACKAGE = "{{ cookiecutter.package_name }}."
# A line that holds a key: `key:` or `- key:` (a list item). class_path and init_args are the
# syntax of a class choice; the key above them says what the class is for.
KEY_LINE = re.compile(r"^\s*(- )?(?!class_path:|init_args:)[A-Za-z_][\w.]*:")


def printed_defaults(capsys: pytest.CaptureFixture) -> dict[str, Any]:
    with pytest.raises(SystemExit) as stop:
        main(["--print_config"])
    assert stop.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def differences(shown: Any, printed: Any, key: str = "", other_library: bool = False) -> list[str]:
    """Where the file and train.py disagree: a value, a key in only one of them.

    Keys that a newer version of another library adds to its own classes (an optimizer's, a
    logger's, a Lightning callback's arguments) may be missing from the file; any other key,
    and every value the file shows, must match.
    """
    if isinstance(shown, dict) and isinstance(printed, dict):
        if "class_path" in printed:
            other_library = not str(printed["class_path"]).startswith(PACKAGE)
        found = [
            f"{key}{name} is not a default of train.py" for name in shown.keys() - printed.keys()
        ]
        if not other_library:
            found += [f"{key}{name} is missing" for name in printed.keys() - shown.keys()]
        for name in shown.keys() & printed.keys():
            found += differences(shown[name], printed[name], f"{key}{name}.", other_library)
        return found
    if isinstance(shown, list) and isinstance(printed, list) and len(shown) == len(printed):
        return [
            line
            for index, (one, other) in enumerate(zip(shown, printed, strict=True))
            for line in differences(one, other, f"{key}{index}.", other_library)
        ]
    if shown != printed:
        return [f"{key.rstrip('.')} is {shown!r} in the file, {printed!r} in train.py"]
    return []


def test_the_default_config_shows_the_defaults_of_train_py(capsys: pytest.CaptureFixture) -> None:
    found = differences(yaml.safe_load(DEFAULTS.read_text()), printed_defaults(capsys))
    assert not found, f"{DEFAULTS} is out of date:\n" + "\n".join(found)


def test_every_key_of_the_default_config_has_a_comment() -> None:
    lines = DEFAULTS.read_text().splitlines()
    bare = [
        line.strip()
        for previous, line in zip(["", *lines], lines, strict=False)
        if KEY_LINE.match(line) and " # " not in line and not previous.lstrip().startswith("#")
    ]
    assert not bare, f"keys without a comment in {DEFAULTS.name}: {bare}"


def test_a_default_changed_only_in_the_file_changes_the_run(tmp_path: Path) -> None:
    """The file is found beside the project's code, whatever the working directory."""
    project = tmp_path / "project"
    for name in ("src", "configs"):
        shutil.copytree(DEFAULTS.parents[1] / name, project / name)
    shutil.copy(DEFAULTS.parents[1] / "train.py", project)
    edited = yaml.safe_load(DEFAULTS.read_text())
    edited["trainer"]["max_epochs"] = 3
    edited["model"]["warmup_fraction"] = 0.25
    (project / "configs" / "default.yaml").write_text(yaml.safe_dump(edited))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Both at once (each imports Lightning): the file is found from elsewhere, and --help shows it.
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "COLUMNS": "200"}
    started = [
        subprocess.Popen(
            [sys.executable, str(project / "train.py"), flag],
            cwd=elsewhere, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for flag in ("--print_config", "--help")
    ]  # fmt: skip
    outputs = [process.communicate(timeout=120) for process in started]
    (printed, printed_err), (shown, shown_err) = outputs
    assert started[0].returncode == 0, printed_err[-3000:]
    config = yaml.safe_load(printed)
    assert config["trainer"]["max_epochs"] == 3
    assert config["model"]["warmup_fraction"] == 0.25
    assert started[1].returncode == 0, shown_err[-3000:]
    # --help shows the file's value as the default (its own block, up to the next option)
    block = shown.split("\n  --model.warmup_fraction ")[1].split("\n  --")[0]
    assert "default: 0.25)" in " ".join(block.split()), block
