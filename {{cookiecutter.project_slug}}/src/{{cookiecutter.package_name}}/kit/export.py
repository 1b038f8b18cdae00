"""Export a checkpoint's network to ONNX, torch.export (.pt2) or a state_dict, each verified.

Every artifact is loaded back the way predict.py loads it and must give the
LightningModule's logits on a real validation batch, for batch sizes 1 and 7,
within `tolerance`; otherwise it is deleted and the export fails.

The metadata file beside each artifact holds the preprocessing as data (`preprocessing`, with
`mean`, `std`, `input_shape`), which the project's inputs module measures from the data module's
`prediction_transform` and checks against it (`describe`), and that module's name (`inputs`),
which applies it (`preprocess`): serving needs neither Lightning nor this project's classes.
"""

import copy
import json
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
from jsonargparse import ArgumentParser
from lightning.pytorch import LightningModule
from torch import Tensor
from torch.export import Dim
from torch.utils.data import default_collate

from .checkpoint import (
    class_names,
    data_class,
    data_state,
    load_model,
    resolve_checkpoint,
    run_config,
)
from .cli import build_cli
from .errors import ConfigError
from .inference import METADATA_VERSION, load_classifier, metadata_path
from .project import current
from .runs import quiet_known_noise

SUFFIX = {"onnx": ".onnx", "torch_export": ".pt2", "state_dict": ".pt"}
TOLERANCE = 1e-4
BATCH_SIZES = (1, 7)
# The batch dimension stays dynamic in every format; inputs keep their trained shape.
DYNAMIC_BATCH = ({0: Dim.DYNAMIC},)


class ParityError(RuntimeError):
    """An exported artifact does not reproduce the model's outputs."""


def export(
    ckpt_path: str, formats: list[str], output_dir: Path | None, tolerance: float = TOLERANCE
) -> list[Path]:
    """Write and verify one artifact (+ metadata file) per format; return the artifacts."""
    if unknown := [f for f in formats if f not in SUFFIX]:
        raise ConfigError(f"--format {', '.join(unknown)} is not one of: {', '.join(SUFFIX)}")
    if not tolerance > 0:
        raise ConfigError(f"--tolerance must be positive, got {tolerance}")
    checkpoint = resolve_checkpoint(ckpt_path)
    model, content = load_model(checkpoint)
    input_shape = tuple(content["hyper_parameters"]["input_shape"])
    data_module = data_class(data_state(content, checkpoint).get("class_path"))
    batch = validation_batch(checkpoint, max(BATCH_SIZES))
    output_dir = output_dir or checkpoint.parent.parent / "export"
    output_dir.mkdir(parents=True, exist_ok=True)
    transform = data_module.prediction_transform(input_shape)
    mean, std = list(data_module.mean), list(data_module.std)
    inputs = current().input_reader()
    steps, check = inputs.describe(transform, input_shape, mean, std)
    if steps is None:
        print(
            f"note: {data_module.__qualname__}.prediction_transform is not one the metadata can "
            f"record as data ({inputs.__name__}.describe found none); the artifacts preprocess "
            "with the data module, so they need this project",
            file=sys.stderr,
        )
    metadata = {
        "metadata_version": METADATA_VERSION,
        "checkpoint": str(checkpoint),
        "class_names": class_names(content, checkpoint),
        "input_shape": list(input_shape),
        "data_class": f"{data_module.__module__}.{data_module.__qualname__}",
        "mean": mean,
        "std": std,
        "preprocessing": steps,
        "inputs": inputs.__name__,
        "transform": repr(transform),
        "output": "logits; their softmax gives the class probabilities",
        "hyper_parameters": content["hyper_parameters"],
        "versions": versions(),
    }
    artifacts = []
    for name in dict.fromkeys(formats):
        artifact = output_dir / f"{checkpoint.stem}{SUFFIX[name]}"
        write(name, model, batch, artifact)
        info = {"format": name, **metadata}
        metadata_path(artifact).write_text(json.dumps(info, indent=2) + "\n")
        info["parity"] = parity = verify(model, batch, artifact, tolerance)
        if check:
            parity["preprocessing"] = check
        metadata_path(artifact).write_text(json.dumps(info, indent=2) + "\n")
        print(f"{name}: {artifact} (max |difference| {parity['max_abs_diff']:.2e} <= {tolerance})")
        artifacts.append(artifact)
    return artifacts


def validation_batch(checkpoint: Path, size: int) -> Tensor:
    """`size` preprocessed validation images, from the data the checkpoint's run was set up with."""
    datamodule = build_cli(["--config", str(run_config(checkpoint))]).datamodule
    datamodule.setup("validate")
    images = datamodule.val_set
    samples = default_collate([images[i % len(images)] for i in range(size)])
    # The preprocessing the Trainer applies to every validation batch after it reaches the device.
    return datamodule.on_after_batch_transfer(samples, 0)[0]


def write(name: str, model: LightningModule, batch: Tensor, artifact: Path) -> None:
    if name == "state_dict":
        torch.save(model.state_dict(), artifact)
        return
    # The graph formats get weights in the default (contiguous) layout: their runtimes pick
    # their own, and torch.export's archive stores a channels-last weight only with a warning.
    network = copy.deepcopy(model.backbone).to(memory_format=torch.contiguous_format)
    if name == "onnx":
        torch.onnx.export(
            network,
            (batch,),
            artifact,
            dynamo=True,
            dynamic_shapes=DYNAMIC_BATCH,
            input_names=["image"],
            output_names=["logits"],
            external_data=False,
            verbose=False,
        )
    else:
        program = torch.export.export(network, (batch,), dynamic_shapes=DYNAMIC_BATCH)
        torch.export.save(program, artifact)


def verify(
    model: LightningModule, batch: Tensor, artifact: Path, tolerance: float
) -> dict[str, Any]:
    """Compare the artifact's logits with the model's; delete it and its metadata if they differ."""
    network = load_classifier(artifact).network
    with torch.inference_mode():
        diffs = [
            (torch.as_tensor(network(batch[:n])) - model(batch[:n])).abs().max().item()
            for n in BATCH_SIZES
        ]
    if max(diffs) > tolerance:
        artifact.unlink()
        metadata_path(artifact).unlink()
        raise ParityError(
            f"{artifact.name} does not match the model: max |difference| of logits "
            f"{max(diffs):.3g} > tolerance {tolerance} (batch sizes {BATCH_SIZES}); "
            f"artifact removed"
        )
    return {"tolerance": tolerance, "max_abs_diff": max(diffs), "batch_sizes": list(BATCH_SIZES)}


def versions() -> dict[str, str]:
    """Versions of the libraries that wrote the artifacts."""
    found = {}
    for package in ("torch", "torchvision", "lightning", "onnx", "onnxscript", "onnxruntime"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            continue
    return found


def main(args: list[str] | None = None) -> list[Path]:
    parser = ArgumentParser(description="Export a checkpoint, verified against the model.")
    parser.add_argument("--ckpt_path", default="best", help="A checkpoint file, 'best' or 'last'.")
    parser.add_argument(
        "--format", nargs="+", default=["onnx"], help=f"One or more of: {', '.join(SUFFIX)}."
    )
    parser.add_argument(
        "--output_dir", type=Path | None, default=None, help="Default: <run>/export."
    )
    parser.add_argument(
        "--tolerance", type=float, default=TOLERANCE, help="Largest |logit difference|."
    )
    config = parser.parse_args(args)
    quiet_known_noise()
    try:
        return export(config.ckpt_path, config.format, config.output_dir, config.tolerance)
    except (ConfigError, ParityError) as error:
        sys.exit(f"error: {error}")
