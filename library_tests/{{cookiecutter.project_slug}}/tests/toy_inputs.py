"""How the project of points (toy.py) reads its inputs outside training: a point is a text
file, or the bytes of one, holding its two coordinates ("0.5 -1.5"). What the library uses of
it is kit/project.py's `Inputs`; numpy and the standard library only."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from {{ cookiecutter.package_name }}.kit.errors import InputTooLargeError, UnreadableInputError

FIELD = "point"
ONE_FILE = "a text file of two numbers"
ACCEPTED = "text files (.txt) of two numbers"
STEPS = ()  # points are preprocessed by their mean and std alone
LONGEST = 100  # characters: a point is short


def files_in(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.txt"))


def read(source: Path | bytes) -> list[float]:
    data = source.read_bytes() if isinstance(source, Path) else source
    if len(data) > LONGEST:
        raise InputTooLargeError(f"a point is at most {LONGEST} characters")
    try:
        values = [float(value) for value in data.decode().split()]
    except (UnicodeDecodeError, ValueError):
        values = []
    if len(values) != 2:
        raise UnreadableInputError(f"not two numbers: {data[:20]!r}")
    return values


def preprocess(
    raw: list[float], steps: dict[str, Any], mean: list[float], std: list[float]
) -> np.ndarray:
    return (np.asarray(raw, dtype=np.float32) - np.float32(mean)) / np.float32(std)


def describe(
    transform: Callable[[list[float]], Any],
    input_shape: tuple[int, ...],
    mean: list[float],
    std: list[float],
) -> tuple[dict[str, Any] | None, dict[str, float]]:
    """Nothing to record when the data module's transform is the normalisation alone (checked
    on a few points); None otherwise."""
    probes = [[0.0, 0.0], [0.5, -1.5], [-3.0, 2.0]]
    given = [np.asarray(transform(point), dtype=np.float32) for point in probes]
    recorded = [preprocess(point, {}, mean, std) for point in probes]
    difference = max(float(np.abs(a - b).max()) for a, b in zip(given, recorded, strict=True))
    return ({}, {"max_abs_diff": difference, "tolerance": 0.0}) if difference == 0 else (None, {})
