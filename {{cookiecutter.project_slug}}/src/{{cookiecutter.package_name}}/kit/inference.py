"""Load a checkpoint or an exported artifact as one kind of classifier, with the project's
inputs module to read its inputs.

Every format runs the network only; probabilities are the softmax of the logits. A checkpoint
preprocesses with its data module's `prediction_transform`. An exported artifact carries its
preprocessing as data in its metadata file, with the name of the inputs module that applies
it (`preprocess`), so an ONNX or torch.export artifact loads and predicts without Lightning
and without the project's model and data classes; those are imported only for a checkpoint, a
state_dict and an artifact exported before the preprocessing was recorded as data. An ONNX
artifact does not import torch either: onnxruntime runs it on the inputs module's NumPy arrays.
"""

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import softmax

from .errors import ConfigError
from .project import Inputs, Project, current, handed_over, inputs_module

FORMATS = {".ckpt": "checkpoint", ".onnx": "onnx", ".pt2": "torch_export", ".pt": "state_dict"}
# 3: `inputs` names the inputs module. 2: `preprocessing` is the preprocessing as data. Before
# (no `metadata_version`), it was the data module's transform as text, and `data_class`
# preprocessed.
METADATA_VERSION = 3


@dataclass
class Classifier:
    """A network (batch -> logits) with what it needs to read inputs and name classes.

    Model inputs are NumPy arrays where the preprocessing is recorded as data, torch tensors
    where a data module's transform makes them; `stack` batches either kind.
    """

    network: Callable[[Any], Any]  # NumPy arrays in and out for ONNX, torch tensors otherwise
    class_names: list[str]
    input_shape: tuple[int, ...]
    inputs: Inputs
    transform: Callable[[Any], Any]  # a read input -> one model input
    takes_arrays: bool = False  # the network runs on NumPy arrays, without torch

    def input_of(self, source: Path | bytes) -> Any:
        """One input file, or its bytes, as model input; raises errors.UnreadableInputError."""
        return self.transform(self.inputs.read(source))

    def probabilities(self, batch: Any) -> np.ndarray:
        """Class probabilities, (batch, classes), of a batch of model inputs."""
        if self.takes_arrays:
            return softmax(self.network(batch), axis=-1)
        import torch

        with torch.inference_mode():
            return self.network(torch.as_tensor(batch)).softmax(dim=-1).numpy(force=True)


def stack(inputs: Sequence[Any]) -> Any:
    """A batch of `Classifier.input_of`'s model inputs."""
    if all(isinstance(one, np.ndarray) for one in inputs):
        return np.stack(inputs)
    import torch

    return torch.stack([torch.as_tensor(one) for one in inputs])


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
    inputs = inputs_module(recorded_inputs(metadata, path), str(path))
    transform = artifact_transform(metadata, metadata_path(path), inputs)
    names = metadata["class_names"]
    return Classifier(network, names, shape, inputs, transform, takes_arrays=kind == "onnx")


def recorded_inputs(metadata: dict[str, Any], path: Path) -> str:
    """The name of the inputs module an artifact's metadata records, if this project may import
    it (the name comes from a file): a module of the package that holds this library, or the one
    the project handed over names. Before version 3 no name was recorded: the package's own
    `inputs` module reads the inputs (imported without Lightning or the model)."""
    package = __package__.rpartition(".")[0]
    name = metadata.get("inputs") or f"{package}.inputs"
    given = handed_over()
    named = given.inputs if isinstance(given, Project) else None
    if not isinstance(name, str) or not (name == named or name.startswith(f"{package}.")):
        raise ConfigError(
            f"{path}: its metadata names the inputs module {name!r}, which is not one of "
            f"{package}'s; export the model again from this project"
        )
    return name


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
) -> Callable[[Any], Any]:
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
    return lambda raw: inputs.preprocess(raw, steps, mean, std)


def onnx_network(path: Path) -> Callable[[Any], np.ndarray]:
    """Logits (a NumPy array) from an ONNX file run by onnxruntime on the CPU."""
    import onnxruntime

    try:
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own types for every kind of bad file
        reason = str(error).splitlines()[0]
        raise ConfigError(f"{path} is truncated or not an ONNX model ({reason})") from None
    (model_input,) = session.get_inputs()

    def run(batch: Any) -> np.ndarray:
        if not isinstance(batch, np.ndarray):  # a torch tensor (export.py's parity check)
            batch = batch.numpy(force=True)
        (logits,) = session.run(None, {model_input.name: batch})
        return logits

    return run


def exported_network(path: Path) -> Callable[[Any], Any]:
    """Logits from a torch.export program (.pt2)."""
    import torch

    try:
        return torch.export.load(path).module()
    except Exception as error:  # a damaged archive fails in the zip reader or the deserializer
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(f"{path} is truncated or not a torch.export program ({reason})") from None


def state_dict_network(path: Path, metadata: dict[str, Any]) -> Callable[[Any], Any]:
    """Logits from the model that the metadata describes, with the weights in `path`."""
    from .checkpoint import build_model, load_checkpoint

    return build_model(metadata["hyper_parameters"], load_checkpoint(path), path)
