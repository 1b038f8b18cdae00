"""Load a checkpoint or an exported artifact as one kind of classifier, and read images for it.

Every format runs the network only; preprocessing is the data module's
`prediction_transform`, and probabilities are the softmax of the logits.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import Tensor
from torchvision.datasets.folder import default_loader

from .checkpoint import (
    build_model,
    class_names,
    data_class,
    data_state,
    load_checkpoint,
    load_model,
)
from .errors import ConfigError

FORMATS = {".ckpt": "checkpoint", ".onnx": "onnx", ".pt2": "torch_export", ".pt": "state_dict"}


@dataclass
class Classifier:
    """A network (batch -> logits) with what it needs to read images and name classes."""

    network: Callable[[Tensor], Tensor]
    class_names: list[str]
    input_shape: tuple[int, int, int]
    transform: Callable[[Image.Image], Tensor]  # an RGB image -> one model input

    def read_image(self, path: Path) -> Tensor:
        """One image file as model input; an undecodable file raises OSError or ValueError."""
        return self.transform(default_loader(str(path)))

    def to_input(self, image: Image.Image) -> Tensor:
        return self.transform(image.convert("RGB"))

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
        model, checkpoint = load_model(path)
        shape = tuple(checkpoint["hyper_parameters"]["input_shape"])
        data = data_class(data_state(checkpoint, path).get("class_path"))
        transform = data.prediction_transform(shape)
        return Classifier(model, class_names(checkpoint, path), shape, transform)
    metadata = read_metadata(path)
    network = {"onnx": onnx_network, "torch_export": exported_network}.get(kind)
    network = network(path) if network else state_dict_network(path, metadata)
    shape = tuple(metadata["input_shape"])
    transform = data_class(metadata.get("data_class")).prediction_transform(shape)
    return Classifier(network, metadata["class_names"], shape, transform)


def read_metadata(artifact: Path) -> dict[str, Any]:
    path = metadata_path(artifact)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{artifact} needs its metadata file {path} next to it") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is not valid JSON ({error})") from None


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
    return build_model(metadata["hyper_parameters"], load_checkpoint(path), path)
