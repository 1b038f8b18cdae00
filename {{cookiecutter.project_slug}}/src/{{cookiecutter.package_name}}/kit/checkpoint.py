"""Safe loading of checkpoints and weights: plain data only, one-line errors naming the file."""

import contextlib
import importlib
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import instantiate_module
from torch import Tensor

from .datamodule import ImageDataModule
from .errors import ConfigError
from .layers import last_linear
from .project import current, first_line

EXPERIMENT = Path("runs") / "default"
ZIP_START = b"PK\x03\x04"  # a zip archive's first local file header
PICKLE_START = b"\x80"  # the protocol marker of pickle protocol 2 and later


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a torch-saved file with weights_only=True; a bad file raises ConfigError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path} is not a file; give a checkpoint or weights file")
    with path.open("rb") as file:
        start = file.read(4)
    # torch.save writes a zip archive (its legacy format: a pickle stream). Any other file would
    # reach torch's legacy reader, which fails with a KeyError or a misleading safety refusal.
    if start and not start.startswith((ZIP_START, PICKLE_START)):
        raise ConfigError(
            f"{path} is not a torch file (torch.save writes a zip archive); give a checkpoint "
            "or weights file"
        )
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if "weights only load failed" in str(error).lower():
            raise ConfigError(
                f"{path} was refused: it holds a pickled Python object, not only tensors and "
                f"plain data, and loading it could run arbitrary code"
            ) from None
        raise ConfigError(f"{path} is truncated or corrupt ({error})") from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError) as error:
        reason = first_line(error)
        raise ConfigError(f"{path} is truncated or not a torch file ({reason})") from None
    if not isinstance(content, dict):
        raise ConfigError(f"{path} holds a {type(content).__name__}, not a checkpoint dictionary")
    return content


def load_weights(module: torch.nn.Module, state_dict: Mapping[str, Tensor], source: Path) -> None:
    """Load `state_dict` into `module`; missing, unexpected or reshaped layers raise ConfigError."""
    if differ := layer_differences(state_dict, module.state_dict()):
        raise ConfigError(f"{source} does not fit this architecture: {'; '.join(differ)}")
    module.load_state_dict(state_dict)


def layer_differences(state: Mapping[str, Tensor], expected: Mapping[str, Tensor]) -> list[str]:
    """Each layer that is in only one of two state dicts, or has another shape in each."""
    differ = [f"{key} not in the model" for key in state.keys() - expected.keys()]
    differ += [f"{key} not in the checkpoint" for key in expected.keys() - state.keys()]
    differ += [
        f"{key} {tuple(state[key].shape)} (now {tuple(value.shape)})"
        for key, value in expected.items()
        if key in state and state[key].shape != value.shape
    ]
    return sorted(differ)


def start_from(model: LightningModule, path: Path) -> str:
    """Load the backbone weights that `path` holds into `model`; return what was loaded.

    `path`: a checkpoint of any run of this project, or a state_dict of the backbone alone
    (torch-saved or .safetensors), or of the network a backbone wraps (a timm or torchvision
    model's own, as `model.state_dict()` saves it). A classifier trained for another class
    count stays new; every other difference raises ConfigError naming the layers.
    """
    weights = read_weights(path)
    if isinstance(weights.get("state_dict"), Mapping):  # a run's checkpoint: the whole model
        weights = {
            key.removeprefix("backbone."): value
            for key, value in weights["state_dict"].items()
            if key.startswith("backbone.")
        }
    expected = model.backbone.state_dict()
    if weights and not weights.keys() & expected.keys():
        # The keys of a wrapped network (TimmBackbone's `net`) lie under its name here.
        for name, module in model.backbone.named_modules():
            if name and weights.keys() & module.state_dict().keys():
                weights = {f"{name}.{key}": value for key, value in weights.items()}
                break
    head = last_linear(model.backbone)
    reshaped = [
        key
        for key in (f"{head}.weight", f"{head}.bias")
        if key in weights and key in expected and weights[key].shape != expected[key].shape
    ]
    if differ := [d for d in layer_differences(weights, expected) if d.split()[0] not in reshaped]:
        more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
        raise ConfigError(
            f"--init_from {path} does not fit the backbone: {'; '.join(differ[:3])}{more}"
        )
    model.backbone.load_state_dict({**weights, **{key: expected[key] for key in reshaped}})
    loaded = f"Started from {path}: {len(weights) - len(reshaped)} tensors of the backbone"
    if not reshaped:
        return loaded
    was, now = len(weights[reshaped[0]]), len(expected[reshaped[0]])
    return f"{loaded}; the classifier {head} starts new ({was} classes there, {now} here)"


def read_weights(path: Path) -> dict[str, Any]:
    """A checkpoint or state_dict file, torch-saved (weights only) or .safetensors."""
    if path.suffix != ".safetensors":
        return load_checkpoint(path)
    if not path.is_file():
        raise ConfigError(f"{path} is not a file; give a checkpoint or weights file")
    try:
        return safetensors.torch.load_file(path)
    except Exception as error:  # safetensors raises its own error types, one per problem
        raise ConfigError(f"{path} is not a readable safetensors file ({error})") from None


def build_model(
    hparams: dict[str, Any], state_dict: Mapping[str, Tensor], source: Path
) -> LightningModule:
    """The project's model described by `hparams` with the given weights, in eval mode."""
    # LightningCLI records which function built the model; the arguments are the rest.
    arguments = {key: value for key, value in hparams.items() if key != "_instantiator"}
    if "compile" in arguments:  # a model that can compile: inference runs uncompiled, since
        arguments["compile"] = False  # compiling only pays off over many training steps
    model = instantiate_module(current().model, arguments)
    load_weights(model, state_dict, source)
    return model.eval()


def load_model(path: str | Path) -> tuple[LightningModule, dict[str, Any]]:
    """The model of a Lightning checkpoint (eval mode) and the checkpoint's content."""
    path = Path(path)
    checkpoint = load_checkpoint(path)
    for key in ("state_dict", "hyper_parameters"):
        if key not in checkpoint:
            raise ConfigError(f"{path} is not a Lightning checkpoint of this project (no {key!r})")
    return build_model(checkpoint["hyper_parameters"], checkpoint["state_dict"], path), checkpoint


def data_state(checkpoint: dict[str, Any], path: Path) -> dict[str, Any]:
    """What the run's data module saved into the checkpoint: class names, its class."""
    for value in checkpoint.values():
        if isinstance(value, dict) and value.get("class_names"):
            return value
    raise ConfigError(f"{path} has no class names (it was saved without the data module)")


def class_names(checkpoint: dict[str, Any], path: Path) -> list[str]:
    return list(data_state(checkpoint, path)["class_names"])


def data_class(class_path: str | None) -> type[ImageDataModule]:
    """The data module class of a run: it knows the normalisation and the preprocessing.

    Only a class of the project's package is imported (the name comes from a file): the
    package that holds this library, or the one of the model class the project hands over.
    """
    package = __package__.rpartition(".")[0]  # the project's package, which holds this one
    class_path = class_path or f"{package}.data.DataModule"  # files from before it was saved
    module, _, name = class_path.rpartition(".")
    found = None
    trusted = (package, current().model.__module__.partition(".")[0])
    if any(module == top or module.startswith(f"{top}.") for top in trusted):
        with contextlib.suppress(ImportError):
            found = getattr(importlib.import_module(module), name, None)
    if not (isinstance(found, type) and issubclass(found, ImageDataModule)):
        raise ConfigError(
            f"data class {class_path} is not a data module of {package} that can be imported"
        )
    return found


def resolve_checkpoint(ckpt_path: str, experiment: Path = EXPERIMENT) -> Path:
    """A checkpoint file: the given path, or 'best' / 'last' of the newest run of `experiment`."""
    if ckpt_path not in ("best", "last"):
        if not Path(ckpt_path).is_file():
            raise ConfigError(
                f"ckpt_path {ckpt_path!r} is not a file; give a checkpoint file, 'best' or 'last'"
            )
        return Path(ckpt_path)
    runs = sorted(
        experiment.glob("version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime
    )
    if not runs:
        # 'best' too is found through the newest run's last.ckpt, which records it.
        raise ConfigError(
            f"--ckpt_path {ckpt_path}: no trained run under {experiment} (none has "
            "checkpoints/last.ckpt); train first or give a checkpoint file"
        )
    last = runs[-1]
    if ckpt_path == "last":
        return last
    # The ModelCheckpoint that monitors a metric remembers the best file it wrote.
    states = load_checkpoint(last).get("callbacks", {}).values()
    best = [s["best_model_path"] for s in states if s.get("monitor") and s.get("best_model_path")]
    if not best or not Path(best[0]).is_file():
        raise ConfigError(f"--ckpt_path best: {last} names no best checkpoint that still exists")
    return Path(best[0])


def run_config(checkpoint: Path) -> Path:
    """The config.yaml of the run folder that holds `checkpoint` (run/checkpoints/x.ckpt)."""
    config = checkpoint.parent.parent / "config.yaml"
    if checkpoint.parent.name != "checkpoints" or not config.is_file():
        raise ConfigError(
            f"{checkpoint} is not inside a run folder with a config.yaml "
            f"(runs/<experiment>/version_N/checkpoints/); the data setup comes from there"
        )
    return config
