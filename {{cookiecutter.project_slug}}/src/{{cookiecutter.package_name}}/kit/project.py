"""What the library needs from a project, and how the project hands it over.

The library never imports the project's modules. The project's entry scripts hand over its
LightningModule class (`use`, before the library's entry point runs); the data module's class
comes from the config (`data.class_path`).

The model class, a LightningModule, provides (`check_model` names a missing one at start):
  backbone      an nn.Module from inputs to logits; its last nn.Linear is the classifier
                (--init_from keeps the rest, FreezeBackbone freezes the rest)
  val_metrics   a torchmetrics MetricCollection with prefix "val/": what --monitor may name
                besides val/loss, each metric's higher_is_better telling which way is better
  its optimizer's parameter groups named "classifier" and "features" (FreezeBackbone)
  optionally parameter_groups(): those groups, so that resuming with another grouping is
                refused in one line (otherwise the optimizer's state fails to load)
  hyperparameters saved (save_hyperparameters): a checkpoint rebuilds the model from them
  optionally loss: called as loss(logits, labels) on the dry run's logits, so that an
                argument it takes but cannot compute with is refused at start
The data module class provides what datamodule.ImageDataModule documents (class names, input
shape, normalisation, prediction transform), checked by its `check_contract` at start.
Every default of the command line is in one YAML file: the project's configs/default.yaml,
unless the Project names another (`defaults`).
Outside training (export, predict, serve), the library reads inputs with the project's inputs
module (`inputs`, by name: an exported model's metadata records it), which `Inputs` describes.
"""

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from .errors import ConfigError

if TYPE_CHECKING:  # imported when used: predicting from an exported file needs no Lightning
    from lightning.pytorch import LightningModule
    from numpy import ndarray


class Inputs(Protocol):
    """What the library uses of a project's inputs module (export, predict, serve). It should
    import neither Lightning nor the model: serving an exported model imports it."""

    FIELD: str  # the key of a served request's JSON body that holds one input, in base64
    ONE_FILE: str  # one input file (given by name, or in a request), in words ("an image file")
    ACCEPTED: str  # the files it reads from a folder, in words ("image files (.jpg, ...)")
    STEPS: tuple[str, ...]  # the keys that a recorded preprocessing (describe's answer) holds

    @staticmethod
    def files_in(folder: Path) -> list[Path]:
        """The input files under a folder, sorted ([]: none)."""

    @staticmethod
    def read(source: Path | bytes) -> Any:
        """One input from its file or bytes; raises errors.UnreadableInputError (an input
        too large: InputTooLargeError)."""

    @staticmethod
    def preprocess(
        raw: Any, steps: dict[str, Any], mean: list[float], std: list[float]
    ) -> "ndarray":
        """A read input -> one model input, from the preprocessing recorded as data."""

    @staticmethod
    def describe(
        transform: Callable[[Any], Any],
        input_shape: tuple[int, ...],
        mean: list[float],
        std: list[float],
    ) -> tuple[dict[str, Any] | None, dict[str, float]]:
        """The data module's prediction transform as data for `preprocess` (None: it cannot be
        recorded), and how closely `preprocess` reproduces it."""


def inputs_module(name: str, origin: str) -> Inputs:
    """The inputs module of that name; a one-line error naming `origin` if it cannot be had."""
    if not isinstance(name, str) or not name or name.startswith("."):
        raise ConfigError(f"{origin}: give the inputs module or its absolute name, not {name!r}")
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        raise ConfigError(
            f"{origin}: its inputs module {name} cannot be imported ({error})"
        ) from None
    members = [*Inputs.__annotations__, "files_in", "read", "preprocess", "describe"]
    if missing := [member for member in members if not hasattr(module, member)]:
        raise ConfigError(
            f"{origin}: inputs module {name} lacks {', '.join(missing)} (kit.project.Inputs)"
        )
    return module  # type: ignore[return-value]


@dataclass(frozen=True)
class Project:
    """The project's classes, as the library takes them, and the file that holds every default
    of the command line (None: configs/default.yaml beside the project's src/ folder or beside
    the running script)."""

    model: "type[LightningModule]"
    defaults: Path | None = None
    inputs: str | ModuleType | None = None  # the inputs module, or its name (kept as the name)

    def __post_init__(self) -> None:
        from lightning.pytorch import LightningModule

        if not (isinstance(self.model, type) and issubclass(self.model, LightningModule)):
            raise ConfigError(f"Project(model={self.model!r}): give a LightningModule class")
        if self.defaults is not None:
            if not Path(self.defaults).is_file():
                raise ConfigError(f"Project(defaults={str(self.defaults)!r}): no such file")
            # Read later, maybe from another working directory.
            object.__setattr__(self, "defaults", Path(self.defaults).resolve())
        if isinstance(self.inputs, ModuleType):  # a name pickles (a server's workers)
            object.__setattr__(self, "inputs", self.inputs.__name__)
        if self.inputs is not None:
            inputs_module(self.inputs, f"Project(inputs={self.inputs!r})")

    def input_reader(self) -> Inputs:
        """The project's inputs module (export, predict and serve read inputs with it)."""
        if self.inputs is None:
            raise ConfigError(
                "the project names no inputs module: Project(model=..., inputs=<module>) "
                "(kit.project.Inputs says what it holds)"
            )
        return inputs_module(self.inputs, "the project")


_current: list["Project | Callable[[], Project]"] = []


def use(project: "Project | Callable[[], Project]") -> None:
    """Hand the project over, or a function that gives it when a run first needs the model:
    the library's entry points build and load the project's model from now on."""
    # A class is callable too: use(ImageClassifier) would fail later, far from here.
    if not isinstance(project, Project) and (isinstance(project, type) or not callable(project)):
        raise ConfigError(f"use({project!r}): give a Project(model=<LightningModule class>)")
    _current[:] = [project]


def handed_over() -> "Project | Callable[[], Project] | None":
    """What `use` was given (None: nothing yet), for a process that starts others by spawning
    them: they run no entry script's `__main__` and take it along (a server's workers)."""
    return _current[0] if _current else None


def current() -> Project:
    """The project handed over by `use`."""
    if _current and not isinstance(_current[0], Project):
        given = _current[0]()
        if not isinstance(given, Project):
            raise ConfigError(f"{_current[0]!r} gave {given!r}, not a Project(model=...)")
        _current[:] = [given]
    if not _current:
        package = __package__.rpartition(".")[0]
        raise ConfigError(
            f"no project handed over: call {__package__}.project.use(Project(model=...)) first "
            f"(the entry scripts hand over {package}.project.project)"
        )
    return _current[0]


def check_input(model: "LightningModule", input_shape: Sequence[int]) -> None:
    """Name, on one line, a backbone that cannot take images of the data's shape, or a loss
    that cannot take its logits (an argument such as label_smoothing 2 fails only then): a dry
    run on two blank images, before a run folder or the data exists."""
    import torch

    was_training = model.training
    model.eval()  # no BatchNorm statistics from this dry run
    try:
        with torch.no_grad():
            # forward(), not the call: a compiled backbone would compile for this one batch.
            logits = model.backbone.forward(torch.zeros(2, *input_shape))
    except RuntimeError as error:
        raise ConfigError(
            f"backbone {type(model.backbone).__name__} does not accept the data's images of "
            f"shape {tuple(input_shape)} (channels, height, width): {first_line(error)}"
        ) from None
    finally:
        model.train(was_training)
    loss = getattr(model, "loss", None)
    if callable(loss):
        try:
            with torch.no_grad():
                loss(logits, torch.zeros(len(logits), dtype=torch.long))
        except (RuntimeError, ValueError) as error:
            raise ConfigError(
                f"model.loss {type(loss).__name__} cannot compute a loss of the backbone's "
                f"logits and class labels: {first_line(error)}"
            ) from None


def first_line(error: Exception) -> str:
    """An error's message on one line: its first, or the error's type when it has none."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def check_model(model: "LightningModule") -> None:
    """Name, on one line, what the model lacks of what the library uses."""
    from torch import nn
    from torchmetrics import MetricCollection

    name = type(model).__name__
    if not isinstance(getattr(model, "backbone", None), nn.Module):
        raise ConfigError(f"model {name} has no `backbone` module (inputs -> logits)")
    collections = [m for m in model.modules() if isinstance(m, MetricCollection)]
    if not any(collection.prefix == "val/" for collection in collections):
        raise ConfigError(
            f"model {name} has no torchmetrics MetricCollection with prefix 'val/' "
            "(its validation metrics, which --monitor may name)"
        )
