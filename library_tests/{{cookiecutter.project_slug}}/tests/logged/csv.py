"""Read back what a run logged, from the metrics.csv in its run folder."""

import csv
from pathlib import Path
from typing import Any

import yaml


def scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) pairs logged under `tag` in a run folder, resumed parts included."""
    with open(run / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    return [(int(row["step"]), float(row[tag])) for row in rows if row.get(tag)]


def hyperparameters(run: Path) -> dict[str, Any]:
    """The hyperparameters the run logged (hparams.yaml in its run folder)."""
    # Lightning writes the model's own arguments there too, tuples with Python's YAML tags;
    # the file is the test's own run.
    return yaml.unsafe_load((run / "hparams.yaml").read_text())
