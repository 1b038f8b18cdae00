"""Read back what a run logged, from the TensorBoard event files in its run folder."""

from pathlib import Path
from typing import Any

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData


def scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) pairs logged under `tag` in a run folder."""
    events = EventAccumulator(str(run))
    events.Reload()
    return (
        [(e.step, e.value) for e in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []
    )


def hyperparameters(run: Path) -> dict[str, Any]:
    """What the HParams tab shows of a run: its hyperparameters, and under "metrics" the
    names of the metrics listed with them."""
    events = EventAccumulator(str(run))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    start = HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    experiment = HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    found: dict[str, Any] = {
        name: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
        for name, value in start.session_start_info.hparams.items()
    }
    found["metrics"] = sorted(info.name.tag for info in experiment.metric_infos)
    return found
