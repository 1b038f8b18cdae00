"""Load a checkpoint or an exported artifact as one kind of classifier, with the project's
inputs module to read its inputs.

Every format runs the network only; probabilities are the softmax of the logits. A checkpoint
preprocesses with its data module's `prediction_transform`. An exported artifact carries its
preprocessing as data in its metadata file, with the name of the inputs module that applies
it (`preprocess`), so an ONNX or torch.export artifact loads and predicts without Lightning
and without the project's model and data classes; those are imported only for a checkpoint, a
state_dict and an artifact exported before the preprocessing was recorded as data.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .errors import ConfigError
from .project import Inputs, current, inputs_module

FORMATS = {".ckpt": "checkpoint", ".onnx": "onnx", ".pt2": "torch_export", ".pt": "state_dict"}
# 3: `inputs` names the inputs module. 2: `preprocessing` is the preprocessing as data. Before
# (no `metadata_version`), it was the data module's transform as text, and `data_class`
# preprocessed.
METADATA_VERSION = 3


@dataclass
class Classifier:
    """A network (batch -> logits) with what it needs to read inputs and name classes."""

    network: Callable[[Tensor], Tensor]
    class_names: list[str]
    input_shape: tuple[int, ...]
    inputs: Inputs
    transform: Callable[[Any], Tensor]  # a read input -> one model input

    def input_of(self, source: Path | bytes) -> Tensor:
        """One input file, or its bytes, as model input; raises errors.UnreadableInputError."""
        return self.transform(self.inputs.read(source))

    def probabilities(self, batch: Tensor) -> Tensor:
        with torch.inference_mode():
            return self.network(batch).softmax(dim=-1)


def metadata_path(artifact: Path) -> Path:
    """The metadata file written next to an artifact: model.onnx -> model.onnx.json."""
    return artifact.with_name(artifact.name + ".json")


def load_classifier(path: str | Path) -> Classifier:
    """A checkpoint (.ckpt) or an artifact (.onnx, .pt2, .pt) with its metadata file."""
    path = Path(path)
    kind = FORMATS.get(path.suffix)
    if kind is None:
        raise ConfigError(f"{path} has none of the accepted suffixes: {', '.join(FORMATS)}")
    if not path.is_file():
        raise ConfigError(f"{path} is not a file")
    if kind == "checkpoint":
        from .checkpoint import class_names, data_class, data_state, load_model

        model, checkpoint = load_model(path)
        shape = tuple(checkpoint["hyper_parameters"]["input_shape"])
        data = data_class(data_state(checkpoint, path).get("class_path"))
        transform = data.prediction_transform(shape)
        inputs = current().input_reader()
        return Classifier(model, class_names(checkpoint, path), shape, inputs, transform)
    metadata = read_metadata(path)
    network = {"onnx": onnx_network, "torch_export": exported_network}.get(kind)
    network = network(path) if network else state_dict_network(path, metadata)
    shape = tuple(metadata["input_shape"])
    # Before version 3, the project's own inputs module (the one it hands over) reads them.
    name = metadata.get("inputs")
    inputs = inputs_module(name, str(path)) if name else current().input_reader()
    transform = artifact_transform(metadata, metadata_path(path), inputs)
    return Classifier(network, metadata["class_names"], shape, inputs, transform)


def read_metadata(artifact: Path) -> dict[str, Any]:
    path = metadata_path(artifact)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{artifact} needs its metadata file {path} next to it") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is not valid JSON ({error})") from None


def artifact_transform(
    metadata: dict[str, Any], source: Path, inputs: Inputs
) -> Callable[[Any], Tensor]:
    """A read input -> model input, from the preprocessing the metadata records as data.

    Metadata without it (an export from before, where `preprocessing` was the transform's
    text, or a data module whose transform the export could not describe) names the data
    module, whose `prediction_transform` then preprocesses, as before.
    """
    steps = metadata.get("preprocessing")
    if not isinstance(steps, dict):
        from .checkpoint import data_class

        return data_class(metadata.get("data_class")).prediction_transform(
            tuple(metadata["input_shape"])
        )
    if missing := [key for key in inputs.STEPS if key not in steps]:
        raise ConfigError(f"{source}: 'preprocessing' lacks {', '.join(missing)}")
    mean, std = metadata["mean"], metadata["std"]
    return lambda raw: torch.from_numpy(inputs.preprocess(raw, steps, mean, std))


def onnx_network(path: Path) -> Callable[[Tensor], Tensor]:
    """Logits from an ONNX file run by onnxruntime on the CPU."""
    import onnxruntime

    try:
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own types for every kind of bad file
        reason = str(error).splitlines()[0]
        raise ConfigError(f"{path} is truncated or not an ONNX model ({reason})") from None
    (model_input,) = session.get_inputs()

    def run(batch: Tensor) -> Tensor:
        (logits,) = session.run(None, {model_input.name: batch.numpy(force=True)})
        return torch.from_numpy(logits)

    return run


def exported_network(path: Path) -> Callable[[Tensor], Tensor]:
    """Logits from a torch.export program (.pt2)."""
    try:
        return torch.export.load(path).module()
    except Exception as error:  # a damaged archive fails in the zip reader or the deserializer
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(f"{path} is truncated or not a torch.export program ({reason})") from None


def state_dict_network(path: Path, metadata: dict[str, Any]) -> Callable[[Tensor], Tensor]:
    """Logits from the model that the metadata describes, with the weights in `path`."""
    from .checkpoint import build_model, load_checkpoint

    return build_model(metadata["hyper_parameters"], load_checkpoint(path), path)
