"""Read back what a run logged, from the TensorBoard event files in its run folder."""

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) pairs logged under `tag` in a run folder."""
    events = EventAccumulator(str(run))
    events.Reload()
    return (
        [(e.step, e.value) for e in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []
    )
