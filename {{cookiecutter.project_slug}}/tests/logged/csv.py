"""Read back what a run logged, from the metrics.csv in its run folder."""

import csv
from pathlib import Path


def scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) pairs logged under `tag` in a run folder, resumed parts included."""
    earlier = sorted(run.glob("metrics-*.csv"), key=lambda p: int(p.stem.split("-")[1]))
    rows = []
    for path in [*earlier, run / "metrics.csv"]:
        with open(path, newline="") as file:
            rows += list(csv.DictReader(file))
    return [(int(row["step"]), float(row[tag])) for row in rows if row.get(tag)]
