"""What a run folder records, read without Lightning or torch: `results.py` lists, diffs and
compares runs from these alone, so it starts in a fraction of a training run's start-up."""

from typing import Any

# Which way each validation metric is better, per run: {"val/loss": "min", "val/acc": "max"}.
DIRECTIONS = "metric_directions.json"


def flatten(config: dict[str, Any]) -> dict[str, Any]:
    """A config as dotted keys and their values (lists of classes numbered)."""
    flat: dict[str, Any] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict) and value:
            for name, inner in value.items():
                walk(inner, f"{key}.{name}" if key else str(name))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for number, inner in enumerate(value):
                walk(inner, f"{key}.{number}")
        else:
            flat[key] = value

    walk(config, "")
    return flat
