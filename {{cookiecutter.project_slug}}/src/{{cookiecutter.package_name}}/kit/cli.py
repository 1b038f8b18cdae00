"""The command line: LightningCLI with short flags, argument links and the default callbacks.

Only the parser's configuration lives here; the recipe that runs it is train.py.
"""

import ast
import contextlib
import functools
import importlib
import inspect
import itertools
import os
import re
import sys
import warnings
from argparse import SUPPRESS
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
import yaml
from jsonargparse import Namespace
from jsonargparse.typing import PositiveFloat
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.callbacks import (
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    ProgressBar,
    ThroughputMonitor,
)
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies import StrategyRegistry

from .callbacks import (
    BatchSizeReport,
    BestValidation,
    EpochLine,
    StepProgressBar,
    SyncEpochMetrics,
)
from .checkpoint import run_config
from .datamodule import ImageDataModule
from .errors import ConfigError, config_error_in
from .guards import RngState, SaveOnPreemption, StopOnDivergence
from .plots import ConfusionMatrixPlot, TrainingCurves
from .project import check_input, check_model, current
from .runs import (
    SaveRunConfig,
    first_logger,
    log_into_resumed_run,
    metric_directions,
    release,
    resume_checkpoint,
)

# Seconds one process waits for the others in a collective before the run stops with an error.
# Long enough for rank 0 to download a dataset while the others wait; torch's own default is
# 30 minutes, so a run whose processes fell out of step would seem to hang.
COLLECTIVE_TIMEOUT = 600.0
SHORT_FLAGS = ("accelerator", "devices", "num_nodes", "precision", "strategy", "max_epochs")

# Every callback of a run, under its own key: each shows in the run's config.yaml, changes by
# flag (--early_stopping.patience 5) or by class (--progress_bar <package>.kit.callbacks.
# PacedProgressBar), and `--<key> null` switches it off. The class and settings each key starts
# with are in configs/default.yaml; None: off there (freeze_backbone, ema).
CALLBACKS = {
    # The best checkpoint by --monitor (its name and mode follow it), and the newest state
    # for resuming in last.ckpt, which ModelCheckpoint's own save_last refreshes only when the
    # best improves. Lightning takes an epoch or a step interval per callback, so two refresh
    # last.ckpt: one after every validation, one every N steps (a kill loses at most N).
    "checkpoint": ModelCheckpoint,
    "last_checkpoint": ModelCheckpoint,
    "step_checkpoint": ModelCheckpoint,
    "early_stopping": EarlyStopping,
    # Before the LR monitor, which then logs the frozen layers' rate as 0.
    "freeze_backbone": None,
    "lr_monitor": LearningRateMonitor,
    "ema": None,
    "curves": TrainingCurves,
    "confusion_matrix": ConfusionMatrixPlot,
    "best_validation": BestValidation,
    "sync_epoch_metrics": SyncEpochMetrics,  # before the bar: every rank syncs at one point
    "batch_size_report": BatchSizeReport,
    "epoch_line": EpochLine,
    "throughput": ThroughputMonitor,
    "rng_state": RngState,
    "stop_on_divergence": StopOnDivergence,
    "save_on_preemption": SaveOnPreemption,
    # Off when the bar is off (--trainer.enable_progress_bar false) or trainer.callbacks has one.
    "progress_bar": StepProgressBar,
}


class Unprofiled(PassThroughProfiler):
    """No profiling, as with Lightning's default profiler, at less cost per hook.

    Lightning wraps each hook it calls in `trainer.profiler.profile(name)`, at every training
    step each hook of every callback whether the callback has it or not; the default's is a
    generator-based context manager that does nothing. This one hands out one context
    manager, made once, that does nothing either (`with profile(name) as x` gives None, not
    the name: Lightning does not use it).
    """

    nothing = contextlib.nullcontext()

    def profile(self, action_name: str) -> contextlib.nullcontext:
        return self.nothing


class TrainCLI(LightningCLI):
    """Adds short flags, argument links, default callbacks and run-folder resume."""

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        # None chosen (--trainer.profiler null): Lightning's default, at less cost per hook.
        if self.config.trainer.profiler is None and type(trainer.profiler) is PassThroughProfiler:
            trainer.profiler = Unprofiled()
        return trainer

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--ckpt_path",
            type=str | None,
            default=None,
            help="Resume from this checkpoint file, or 'last': the newest run of this experiment.",
        )
        parser.add_argument(
            "--init_from",
            type=str | None,
            default=None,
            help="Start from the backbone weights of this file: a checkpoint of any run, or a "
            "state_dict (.pt, .safetensors) of the backbone; a classifier for another class "
            "count starts new. Ignored when resuming (--ckpt_path).",
        )
        parser.add_argument(
            "--collective_timeout",
            type=PositiveFloat,
            default=COLLECTIVE_TIMEOUT,
            help="Seconds a process waits for the others in one collective (several devices) "
            "before the run stops with an error naming it.",
        )
        for flag in SHORT_FLAGS:
            # A suppressed default keeps the Trainer's own default unless the flag is given.
            parser.add_argument(
                f"--{flag}",
                dest=f"trainer.{flag}",
                type=trainer_flag_type(flag),
                default=SUPPRESS,
                help=f"Short for --trainer.{flag}.",
            )
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.input_shape", "model.input_shape", apply_on="instantiate")

        for key in CALLBACKS:
            parser.add_lightning_class_args(Callback, key, subclass_mode=True, required=False)
        # One key names the headline metric; checkpoint choice and early stopping follow it.
        # val/loss by default, not val/acc: accuracy on a small validation split saturates
        # (the digits reach 1.0 within a few epochs) and would freeze the choice there.
        parser.add_argument(
            "--monitor",
            type=str,
            default="val/loss",
            help="The validation metric that picks the best checkpoint (the one tested) and "
            "stops the run early: val/loss or a metric the model logs (e.g. val/acc).",
        )
        for callback in ("checkpoint", "early_stopping"):
            parser.link_arguments("monitor", f"{callback}.init_args.monitor")
            # Which way is better comes from the model's metrics, so it exists only once the
            # model does; a --monitor the model does not log stops the run here, before data.
            target, mode_of = f"{callback}.init_args.mode", self.mode_of
            parser.link_arguments("model", target, compute_fn=mode_of, apply_on="instantiate")
        parser.link_arguments(
            "monitor", "checkpoint.init_args.filename", compute_fn=checkpoint_name
        )

    def mode_of(self, model: LightningModule) -> str:
        """'min' or 'max': which way --monitor is better, as the model's metric says."""
        check_model(model)
        monitor, directions = self.config["monitor"], metric_directions(model)
        if monitor not in directions:
            raise ConfigError(
                f"--monitor {monitor} is not a validation metric the model logs; accepted: "
                f"{', '.join(directions)}"
            )
        return directions[monitor]

    def parse_arguments(self, parser: LightningArgumentParser, args: object) -> None:
        """Parse; resuming a run folder's checkpoint puts the run's own config.yaml first.

        The run goes on as it was configured (optimizer, backbone, data), and the flags given
        apply on top of it (`--max_epochs 40`), whichever run is the newest.
        """
        super().parse_arguments(parser, args)
        if self.config.ckpt_path is None:
            return
        checkpoint = resume_checkpoint(self.config.ckpt_path, first_logger(self.config))
        with contextlib.suppress(ConfigError):  # a checkpoint outside a run folder as it is
            parser.resumed_config = run_config(checkpoint)
            given = sys.argv[1:] if args is None else list(args)  # type: ignore[call-overload]
            # The flags passed alone: what fails now is in the run's config (another project's).
            try:
                super().parse_arguments(parser, ["--config", str(parser.resumed_config), *given])
            finally:
                parser.resumed_config = None
        self.config.ckpt_path = str(checkpoint)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as error:  # a class's own one-line message, wrapped by jsonargparse
            if (cause := config_error_in(error)) is None:
                raise
            raise cause from None
        check_model(self.model)
        self.datamodule.check_contract()
        # A callback that needs something of the model says so now, before a run folder or
        # the data exists (FreezeBackbone: layers before a classifier to freeze); then the dry
        # run says whether the network takes the data's images and the loss its outputs.
        for callback in self.trainer.callbacks:
            if callable(check := getattr(callback, "check_model", None)):
                check(self.model)
        check_input(self.model, self.datamodule.input_shape)

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        parser = super().init_parser(**kwargs)
        parser.defaults_file = project_defaults()
        return parser

    def before_instantiate_classes(self) -> None:
        check_devices(self.config.trainer.accelerator, self.config.trainer.devices)
        check_strategy(self.config.trainer.strategy)
        check_optimizers(self.config.model)
        if not wants_default_progress_bar(self.config.trainer):
            self.config.progress_bar = None
        # Callbacks switched off (`--<key> null`) are left out of the Trainer's list.
        self.parser.callback_keys = [
            key for key in self.parser.callback_keys if self.config.get(key) is not None
        ]
        if self.config.ckpt_path is not None:  # keep logging into the run being resumed
            log_into_resumed_run(first_logger(self.config), Path(self.config.ckpt_path))
        # A strategy with a process group (DDP, FSDP, ...) gives up on a collective after
        # --collective_timeout seconds, not torch's 30 minutes: one given by name becomes the
        # class and arguments that Lightning's registry holds for the name, and the timeout
        # joins its arguments (config.yaml shows them). `auto` stays: train.py sets the timeout
        # of the strategy that Lightning picks.
        strategy = self.config.trainer.strategy
        if isinstance(strategy, str) and strategy.lower() in StrategyRegistry:
            registered = StrategyRegistry[strategy.lower()]
            cls = registered["strategy"]
            strategy = Namespace(
                class_path=f"{cls.__module__}.{cls.__qualname__}",
                init_args=Namespace(registered["init_params"]),
            )
        if isinstance(strategy, Namespace) and "timeout" in arguments_of(strategy.class_path):
            strategy.init_args.timeout = timedelta(seconds=self.config.collective_timeout)
            self.config.trainer.strategy = strategy


class ParseOnly(TrainCLI):
    """TrainCLI that stops after parsing: used to check arguments without building anything."""

    def instantiate_classes(self) -> None:
        pass


def parse_only(args: list[str]) -> TrainCLI:
    """train.py's flags parsed, nothing built: a check before a search or a repeat starts."""
    try:
        return build_cli(
            args,
            cli_class=ParseOnly,
            parser_kwargs={"exit_on_error": False},
            seed_everything_default=False,
        )
    except Exception as error:
        files = config_files(["--config", str(project_defaults()), *args])
        if "Problems parsing config" in str(error) and (bad := not_yaml(files)):
            raise ConfigError(bad) from error  # which file, and where in it
        raise ConfigError(f"train.py flags: {readable(str(error))}") from error


def configured_loggers(args: Sequence[str]) -> list[dict[str, Any]]:
    """The loggers that train.py's flags give (configs/default.yaml's, or a --config's), as
    plain data: what a repeat or a search gives each of its runs, in a folder of their own."""
    return loggers_of(tuple(args), os.getcwd())  # a --config path is relative to it


@functools.cache
def loggers_of(args: tuple[str, ...], folder: str) -> list[dict[str, Any]]:
    logger = parse_only(list(args)).config.trainer.logger
    found = [
        item.as_dict() if isinstance(item, Namespace) else item
        for item in (logger if isinstance(logger, list) else [logger])
    ]
    if not (found and isinstance(found[0], dict) and "init_args" in found[0]):
        raise ConfigError(
            f"--trainer.logger {logger!r}: runs of a repeat or a search need a logger given by "
            "class_path first (TensorBoardLogger or CSVLogger: its save_dir and name)"
        )
    return found


def build_model(args: list[str]) -> LightningModule:
    """The model that train.py's flags describe, with the numbers its data module gives it;
    nothing trains. A --monitor that the model does not log is refused here, on one line."""
    cli = build_cli(args)
    model = cli.model
    release(cli)  # the data module and the trainer go now
    return model


def project_defaults() -> Path:
    """The file that holds every default of the command line: the one the project names, else
    its configs/default.yaml, beside the src/ folder that holds the project's package (an
    editable install) or beside the running script (the entry scripts sit at its root)."""
    if (named := current().defaults) is not None:
        return Path(named)
    roots = [Path(__file__).resolve().parents[3], Path(sys.argv[0]).resolve().parent]
    for root in roots:
        if (path := root / "configs" / "default.yaml").is_file():
            return path
    raise ConfigError(
        "configs/default.yaml not found in the project (looked in "
        f"{' and '.join(str(root) for root in roots)}): install the project with pip install -e ."
    )


def checkpoint_name(monitor: str) -> str:
    """The best checkpoints' name: epoch and metric value, as in epoch007-val_loss=0.1234."""
    return "epoch{epoch:03d}-" + monitor.replace("/", "_") + "={" + monitor + ":.4f}"


def trainer_flag_type(flag: str) -> Any:
    """The type of the Trainer's argument `flag`, for a short flag that takes the values of
    --trainer.<flag> (which the parser types from the same signature)."""
    return inspect.signature(Trainer.__init__, eval_str=True).parameters[flag].annotation


def wants_default_progress_bar(trainer: object) -> bool:
    """The TQDM bar joins the run unless the bar is off or the config names a bar of its own.

    Lightning's own default is its Rich bar whenever rich is installed (the dev extra brings
    it in), and in a terminal that bar slows the small default run noticeably; TQDM does not.
    """
    if getattr(trainer, "enable_progress_bar", None) is False:
        return False
    callbacks = getattr(trainer, "callbacks", None) or []
    for callback in callbacks if isinstance(callbacks, list) else [callbacks]:
        found = class_at(str(getattr(callback, "class_path", "")))
        if isinstance(found, type) and issubclass(found, ProgressBar):
            return False
    return True


class OneLineErrors(LightningArgumentParser):
    """Reports a bad flag, key or value on one line instead of the whole usage text; the
    command line's own parser reads the project's defaults before the arguments."""

    defaults_file: Path | None = None  # set on the command line's parser, not on nested ones
    resumed_config: Path | None = None  # while the config of a run being resumed is read
    config_files: tuple[str, ...] = ()  # the --config files of the arguments being parsed

    def parse_args(self, args: Sequence[str] | None = None, **kwargs: Any) -> Any:
        if self.defaults_file is not None:
            # As if given first: a --config file, a resumed run's config.yaml and flags
            # override it. (As default_config_files, jsonargparse 4.53 drops the class_path
            # of a callable argument whose default is a class, such as the model's backbone.)
            given = sys.argv[1:] if args is None else list(args)
            args = ["--config", str(self.defaults_file), *given]
            self.config_files = config_files(args)
            if HELP & set(given):  # --help shows the file's values as the defaults
                self.show_defaults(super().parse_args(args[:2], **kwargs))
        return super().parse_args(args, **kwargs)

    def show_defaults(self, values: Namespace) -> None:
        """Make `values` the defaults that --help shows: each argument's whole value (a class
        with its init_args as one), not a group's nor an argument's parts."""
        done: tuple[str, ...] = ("config",)
        for key, value in values.items(branches=True):
            if key == "config" or key.startswith(done):
                continue
            with contextlib.suppress(KeyError):  # a group, not an argument
                self.set_defaults({key: value.as_dict() if isinstance(value, Namespace) else value})
                done += (f"{key}.",)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # jsonargparse is trying alternatives; let it go on
            super().error(message, ex)
        if self.resumed_config is not None:
            sys.exit(f"error: {self.resumed_config}, the resumed run's config: {readable(message)}")
        if "Problems parsing config" in message and (found := not_yaml(self.config_files)):
            sys.exit(f"error: {found}")  # jsonargparse's message names no file
        # The script that was run lists its own options (evaluate.py builds this parser too).
        sys.exit(f"error: {readable(message)} (python {self.prog} --help lists the options)")


def config_files(args: Sequence[str]) -> tuple[str, ...]:
    """The values of the --config arguments in `args`, in order."""
    found = [value for flag, value in itertools.pairwise(args) if flag == "--config"]
    found += [arg.partition("=")[2] for arg in args if arg.startswith("--config=")]
    return tuple(found)


def not_yaml(paths: Sequence[str]) -> str | None:
    """The first of these config files that YAML cannot read: its path, where and why.
    (A value that is no file, such as a YAML string, is jsonargparse's to report.)"""
    for path in paths:
        try:
            text = Path(path).read_text()
        except (OSError, ValueError):
            continue
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as error:
            # A merge that left its conflicts in the file (cruft update, git merge).
            if marker := re.search(r"^(<{7}|={7}|>{7})( |$)", text, re.M):
                line = text.count("\n", 0, marker.start()) + 1
                return (
                    f"{path} holds merge conflict markers ({marker[1]} at line {line}): keep "
                    "one side of each conflict and delete the <<<<<<<, ======= and >>>>>>> lines"
                )
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            why = getattr(error, "problem", None) or str(error).splitlines()[0]
            return f"{path} is not valid YAML{where}: {why}"
    return None


def readable(message: str) -> str:
    """jsonargparse's report of a bad flag, key or value, on one line: the one error that
    matters among the alternatives it tried, and where a class path moved."""
    message = original = " ".join(message.split())
    if found := IN_A_CLASS.search(message) or OF_A_CALLABLE.search(message):
        # a bad value for an argument of a class
        message = f"{found['key']}.{found['arg']} ({found['cls']}): {found['why']}"
    elif found := UNKNOWN_ARGUMENT.search(message):  # a misspelled argument of a class
        cls = found["cls"] or found["given"]
        accepted = ", ".join(arguments_of(cls)) if cls else ""
        message = f"{found['key']}.{found['arg']} is not an argument of {cls or found['key']}"
        message += f"; accepted: {accepted}" if accepted else ""
    elif found := NOT_IMPORTABLE.search(message):  # a class path that does not import
        message = f"{found['key']} {found['path']} cannot be imported: {found['why']}"
    elif found := NONE_OF_THE_TYPES.search(message):  # a value no type of the argument takes
        accepted = ", ".join(accepted_values(found["types"]))
        message = f"{found['key']} {found['given']}: accepted: {accepted}"
    if (found := CLASS_PATH.search(original)) and (
        moved := moved_into_library(path := found["path"] or found["quoted"])
    ):
        message = f"{found['key']} {path} moved: it is {moved} now"
    return message


def moved_into_library(class_path: str) -> str | None:
    """The library's class path of a class that a run's config names by its old path, from
    before the library had a package of its own (<package>.callbacks.EpochLine, ...)."""
    project = __package__.rpartition(".")[0]
    module, _, name = class_path.rpartition(".")
    if not module.startswith(f"{project}.") or module.startswith(f"{__package__}."):
        return None
    if class_at(class_path) is not None:  # the project's own class of that name: not moved
        return None
    new = f"{__package__}.{module.removeprefix(f'{project}.')}.{name}"
    return new if isinstance(class_at(new), type) else None


def arguments_of(class_path: str) -> list[str]:
    """The arguments a config can give a class: those with a default (the others, such as an
    optimizer's parameters or a backbone's channels, come from the model)."""
    try:
        parameters = inspect.signature(class_at(class_path)).parameters.values()
    except (TypeError, ValueError):  # not importable (None), or no signature
        return []
    return [p.name for p in parameters if p.default is not inspect.Parameter.empty]


def class_at(class_path: str) -> object | None:
    """What a dotted class path names, or None if it does not import."""
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name, None) if module else None
    except ImportError:
        return None


# jsonargparse's reports of a class chosen by class_path (the model's loss, optimizer and
# backbone, the data module, a callback): the one error that matters, among the alternatives
# it tried. An argument the class does not have:
UNKNOWN_ARGUMENT = re.compile(
    r'Parser key "(?P<key>[\w.]+)": .*?(?:Problem with given class_path \'(?P<cls>[^\']+)\': )?'
    r"Option '(?P<arg>\w+)' is not accepted"
    r"(?:\. Got value: Namespace\(.*?class_path='(?P<given>[^']+)')?"
)
HELP = {"-h", "--help"}
# A class path given by flag or in a config file, as jsonargparse quotes it.
CLASS_PATH = re.compile(
    r'Parser key "(?P<key>[\w.]+)":.*?(?:Expected a path but (?P<path>[\w.]+) |'
    r"class_path '(?P<quoted>[\w.]+)')"
)
# A class path that does not import:
NOT_IMPORTABLE = re.compile(
    r'Parser key "(?P<key>[\w.]+)": - Expected a path but (?P<path>\S+) either not accessible '
    r"or invalid .*?(?P<why>(?:module|No module) [^.]*?'[^']*'(?: has no attribute '[^']*')?)"
)
# A bad value for an argument of a class:
IN_A_CLASS = re.compile(
    r'Parser key "(?P<key>[\w.]+)": Does not validate against any of the Union subtypes .*?'
    r"Problem with given class_path '(?P<cls>[^']+)': Parser key \"(?P<arg>[\w.]+)\": "
    r"(?P<why>.*?)(?: - |$)"
)

# A bad value for an argument of a class given where a callable is expected (the backbone):
OF_A_CALLABLE = re.compile(
    r'Parser key "(?P<key>[\w.]+)": Type .*? expects a function or a callable class: '
    r'Parser key "(?P<arg>\w+)": (?P<why>.*?)\. Got value: '
    r"Namespace\(class_path='(?P<cls>[^']+)'"
)

# A value that none of an argument's types takes (a precision, a number of epochs):
NONE_OF_THE_TYPES = re.compile(
    r'Parser key "(?P<key>[\w.]+)": Does not validate against any of the Union subtypes '
    r"Subtypes: \[(?P<types>.*?)\] Errors: .*Given value: (?P<given>.*)$"
)
TYPE_NAMES = {"int": "an integer", "float": "a number", "str": "a string", "NoneType": "null"}


def accepted_values(types: str) -> list[str]:
    """What a Union of Literals and classes, as jsonargparse prints it, accepts."""
    accepted: list[str] = []
    parts = r"typing\.Literal\[(?P<values>[^\]]*)\]|<class '(?P<cls>[\w.]+)'>"
    for part in re.finditer(parts, types):
        if part["values"] is not None:
            values = [str(value) for value in ast.literal_eval(f"[{part['values']}]")]
        else:
            name = part["cls"].rpartition(".")[2]
            values = [TYPE_NAMES.get(name, f"a {name}")]
        accepted += [value for value in values if value not in accepted]
    return accepted


def one_line(error: Exception) -> str:
    """jsonargparse's message, which spans several lines, on one."""
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip())


def check_devices(accelerator: object, devices: object) -> None:
    """Refuse an accelerator or a device count this machine does not have, or that Lightning
    does not take, before any work."""
    names = ["auto", "gpu", *sorted(AcceleratorRegistry.available_accelerators())]
    if isinstance(accelerator, str) and accelerator.lower() not in names:
        raise ConfigError(f"--accelerator {accelerator}: accepted: {', '.join(names)}")
    name = str(getattr(accelerator, "class_path", accelerator)).lower()
    if name in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"--accelerator {name}: torch sees no CUDA GPU here; use --accelerator cpu "
            "(or auto), or install a torch build that matches the GPU driver"
        )
    if name not in ("auto", "cpu", "gpu", "cuda"):
        return  # other accelerators (mps, tpu, ...) check their own devices
    on_gpu = name != "cpu" and torch.cuda.is_available()
    given = str(devices).replace(" ", "")
    counted = given == "auto" or re.fullmatch(r"[1-9]\d*", given)
    gpus = on_gpu and (given == "-1" or re.fullmatch(r"\[?\d+(,\d+)*,?\]?", given))
    if not (counted or gpus):
        more = ", -1 (every GPU) or GPU indices (0,1 or [0, 1])" if on_gpu else ""
        raise ConfigError(f"--devices {devices}: accepted: a count (1, 2, ...), auto{more}")
    available = torch.cuda.device_count() if on_gpu else os.cpu_count() or 1
    wanted = len(devices) if isinstance(devices, list) else devices
    if isinstance(wanted, str) and wanted.isdigit():
        wanted = int(wanted)
    if isinstance(wanted, int) and wanted > available:
        what = "GPUs torch sees" if on_gpu else "CPUs this machine has"
        raise ConfigError(f"--devices {devices} is more than the {available} {what}")


def check_strategy(strategy: object) -> None:
    """A strategy name Lightning does not know, refused in one line that lists those it does
    (Lightning's own message comes as a traceback from inside the Trainer)."""
    known = strategy == "auto" or str(strategy).lower() in StrategyRegistry
    if isinstance(strategy, str) and not known:
        names = ", ".join(["auto", *sorted(StrategyRegistry.available_strategies())])
        raise ConfigError(
            f"--strategy {strategy} is not a strategy Lightning knows; accepted: {names}, or a "
            "Strategy class as --trainer.strategy <class path>"
        )


def check_optimizers(model: Namespace) -> None:
    """An optimizer's argument that torch refuses (a negative learning rate, betas outside
    0..1), in one line before anything is built: torch checks them when the optimizer is
    made, after the run folder and the data."""
    for key, value in vars(model).items():
        if not isinstance(value, Namespace) or not isinstance(value.get("class_path"), str):
            continue
        cls = class_at(value.class_path)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            continue
        given = value.get("init_args")
        arguments = given.as_dict() if isinstance(given, Namespace) else dict(given or {})
        try:
            cls([torch.zeros(1, requires_grad=True)], **arguments)
        except (ValueError, TypeError) as error:
            raise ConfigError(f"model.{key} ({value.class_path}): {error}") from None


def build_cli(
    args: list[str] | None,
    callbacks: Sequence[Callback] = (),
    cli_class: type[TrainCLI] = TrainCLI,
    **options: Any,
) -> TrainCLI:
    """The model, data module and trainer of the command line, not run yet: every entry point
    builds it here, `options` overriding LightningCLI's.

    `callbacks` join the run without entering its saved config (e.g. a search's pruning).
    """
    with warnings.catch_warnings():
        # evaluate and export pass a list of their own; sys.argv holds their flags, not these.
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        settings = dict(
            model_class=current().model,
            # Any data module of the contract, by class_path; data.py's by default.
            datamodule_class=ImageDataModule,
            subclass_mode_data=True,
            args=args,
            run=False,
            save_config_callback=SaveRunConfig,
            save_config_kwargs={"overwrite": True},
            parser_class=OneLineErrors,
            parser_kwargs={
                # A prefix of a flag is not taken for the flag (--trainer.max_epoch is a typo).
                "allow_abbrev": False,
                **options.pop("parser_kwargs", {}),
            },
            trainer_defaults={"callbacks": list(callbacks)},
            auto_configure_optimizers=False,
        )
        return cli_class(**{**settings, **options})
