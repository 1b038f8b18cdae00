"""Load a checkpoint or an exported artifact as one kind of classifier, and read images for it.

Every format runs the network only; probabilities are the softmax of the logits. A checkpoint
preprocesses with its data module's `prediction_transform`. An exported artifact carries its
preprocessing as data in its metadata file (`preprocess` below applies it with numpy and
Pillow), so an ONNX or torch.export artifact loads and predicts without Lightning and without
the project's model and data classes; those are imported only for a checkpoint, a state_dict
and an artifact exported before the preprocessing was recorded as data.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from .errors import ConfigError

FORMATS = {".ckpt": "checkpoint", ".onnx": "onnx", ".pt2": "torch_export", ".pt": "state_dict"}
# 2: `preprocessing` is the preprocessing as data. Before (no `metadata_version`), it was the
# data module's transform as text, and `data_class` preprocessed images.
METADATA_VERSION = 2
STEPS = ("mode", "resize", "interpolation", "center_crop", "value_range")


@dataclass
class Classifier:
    """A network (batch -> logits) with what it needs to read images and name classes."""

    network: Callable[[Tensor], Tensor]
    class_names: list[str]
    input_shape: tuple[int, int, int]
    transform: Callable[[Image.Image], Tensor]  # an RGB image -> one model input

    def read_image(self, path: Path) -> Tensor:
        """One image file as model input; an undecodable file raises OSError or ValueError."""
        with Path(path).open("rb") as file, Image.open(file) as image:
            return self.transform(image.convert("RGB"))

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
        from .checkpoint import class_names, data_class, data_state, load_model

        model, checkpoint = load_model(path)
        shape = tuple(checkpoint["hyper_parameters"]["input_shape"])
        data = data_class(data_state(checkpoint, path).get("class_path"))
        transform = data.prediction_transform(shape)
        return Classifier(model, class_names(checkpoint, path), shape, transform)
    metadata = read_metadata(path)
    network = {"onnx": onnx_network, "torch_export": exported_network}.get(kind)
    network = network(path) if network else state_dict_network(path, metadata)
    shape = tuple(metadata["input_shape"])
    transform = artifact_transform(metadata, metadata_path(path))
    return Classifier(network, metadata["class_names"], shape, transform)


def read_metadata(artifact: Path) -> dict[str, Any]:
    path = metadata_path(artifact)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{artifact} needs its metadata file {path} next to it") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is not valid JSON ({error})") from None


def artifact_transform(metadata: dict[str, Any], source: Path) -> Callable[[Image.Image], Tensor]:
    """An RGB image -> model input, from the preprocessing the metadata records as data.

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
    if missing := [key for key in STEPS if key not in steps]:
        raise ConfigError(f"{source}: 'preprocessing' lacks {', '.join(missing)}")
    mean, std = metadata["mean"], metadata["std"]
    return lambda image: torch.from_numpy(preprocess(image, steps, mean, std))


def preprocess(
    image: Image.Image, steps: dict[str, Any], mean: list[float], std: list[float]
) -> np.ndarray:
    """One image -> one model input (C, H, W, float32), with numpy and Pillow only.

    `steps` is the metadata's `preprocessing`: the image is converted to `mode` ("L" or
    "RGB"), resized with `interpolation` to `resize` ([height, width], or an int: the
    shorter side's length, keeping the aspect ratio), cut to its `center_crop` ([height,
    width], or null), and its 8-bit values 0..255 are mapped linearly onto `value_range`
    (the pixel values the model was trained on: [0, 1], or the digits' [0, 16]); then
    `(x - mean) / std` per channel.
    """
    image = image.convert("RGB").convert(steps["mode"])
    width, height = image.size
    size = steps["resize"]
    if isinstance(size, int):  # torchvision's rule: the longer side is rounded down
        short, long = sorted((width, height))
        new_long = int(size * long / short)
        height, width = (new_long, size) if width <= height else (size, new_long)
    else:
        height, width = size
    if (width, height) != image.size:
        image = image.resize((width, height), Image.Resampling[steps["interpolation"].upper()])
    if crop := steps.get("center_crop"):
        top, left = round((height - crop[0]) / 2), round((width - crop[1]) / 2)
        image = image.crop((left, top, left + crop[1], top + crop[0]))
    pixels = np.asarray(image, dtype=np.float32)
    pixels = pixels.reshape(*pixels.shape[:2], -1).transpose(2, 0, 1) * np.float32(1 / 255)
    low, high = steps["value_range"]
    pixels = pixels * np.float32(high - low) + np.float32(low)
    shift, spread = (np.asarray(v, dtype=np.float32).reshape(-1, 1, 1) for v in (mean, std))
    return np.ascontiguousarray((pixels - shift) / spread)


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
