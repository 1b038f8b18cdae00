"""The search space of sweep.py and the command that asks for it, checked before any trial.

The YAML file is read by jsonargparse (sampler and pruner are Optuna classes by class_path);
every parameter key and value is parsed by train.py's own parser.
"""

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from jsonargparse import ArgumentParser, lazy_instance
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.pruners import BasePruner, MedianPruner
from optuna.samplers import BaseSampler

from .cli import build_model, configured_loggers, one_line, parse_only
from .errors import ConfigError
from .repeat import Repeat, fold_count, seed_list
from .runs import metric_directions

SWEEPS = Path("runs/sweeps")
DEFAULT_SPACE = Path("configs/sweep/default.yaml")
SPACE_KEYS = ("metric", "direction", "sampler", "pruner", "params", "repeat")


@dataclass
class Sweep:
    """What one `sweep.py` command asks for."""

    name: str
    metric: str | None  # None: train.py's --monitor, and its direction
    direction: Literal["maximize", "minimize"] | None
    sampler: BaseSampler
    pruner: BasePruner
    space: dict[str, BaseDistribution]
    train_args: list[str]
    n_trials: int
    space_file: Path
    # Each trial over several seeds or folds, its value their mean; None: one run per trial.
    repeat: Repeat | None = None

    def sampler_after(self, trials: int) -> BaseSampler:
        """The sampler for a study that already has `trials` trials.

        A seeded sampler restarted with its seed would draw the first trials' values again;
        its seed moves on by the number of trials, so a continued study is as reproducible
        as a new one and tries new values.
        """
        return read_space(self.space_file, seed_offset=trials).sampler

    @property
    def folder(self) -> Path:
        return SWEEPS / self.name

    @property
    def url(self) -> str:
        return f"sqlite:///{self.folder / 'study.db'}"


def command_line() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sweep.py",
        usage="sweep.py [--config SPACE.yaml] [--n_trials N] [--study NAME] [train.py flags]",
        description="Search hyperparameters with Optuna; each trial is one train.py run. "
        f"--config names the search space (default: {DEFAULT_SPACE}), a YAML file with the keys "
        f"{', '.join(SPACE_KEYS)}.",
        epilog="Every other flag is a train.py flag and applies to every trial, training --config "
        "files included (python train.py --help lists them).",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--n_trials",
        type=int,
        default=20,
        help="finished trials the study should have; running again tops it up (default: 20)",
    )
    parser.add_argument(
        "--study",
        help="study name; its folder is runs/sweeps/<name> (default: the search space file's name)",
    )
    return parser


def parse(argv: list[str]) -> Sweep:
    """Read the command line and the search space; ConfigError names what is wrong."""
    path, argv = pop_search_space(argv)
    own, train_args = command_line().parse_known_args(argv)
    if own.n_trials < 1:
        raise ConfigError(f"--n_trials must be 1 or more, got {own.n_trials}")
    space = read_space(path)
    return Sweep(
        name=own.study or path.stem,
        metric=space.metric,
        direction=space.direction,
        sampler=space.sampler,
        pruner=space.pruner,
        space={key: distribution(key, spec) for key, spec in space.params.items()},
        train_args=train_args,
        n_trials=own.n_trials,
        space_file=path,
        repeat=repeat_of(space.repeat, space.params, train_args),
    )


def repeat_of(spec: dict[str, Any] | None, params: dict, train_args: list[str]) -> Repeat | None:
    """The search space's `repeat: {seeds: N or [S1, S2, ..], folds: K}`, checked."""
    if spec is None:
        return None
    accepted = "repeat: {seeds: N or [S1, S2, ...], folds: K}, one or both"
    if not spec or not set(spec) <= {"seeds", "folds"}:
        raise ConfigError(f"{accepted}; got {spec}")
    seeds, folds = spec.get("seeds"), spec.get("folds")
    try:
        if seeds is not None:
            seeds = seed_list(",".join(map(str, seeds)) if isinstance(seeds, list) else str(seeds))
        folds = fold_count(str(folds)) if folds is not None else None
    except argparse.ArgumentTypeError as error:
        raise ConfigError(f"{accepted}: {error}") from None
    taken = (["seed_everything"] if seeds else []) + (["data.folds", "data.fold"] if folds else [])
    for key in taken:
        if key in params or any(arg.split("=")[0] == f"--{key}" for arg in train_args):
            raise ConfigError(f"{key} is set by the search space's repeat for each run")
    return Repeat(name="", seeds=seeds, folds=folds, train_args=[])


def pop_search_space(argv: list[str]) -> tuple[Path, list[str]]:
    """Take the search space out of the arguments; other --config files are for training.

    A --config file is the search space when its top level has a search-space key.
    """
    spaces, rest = [], []
    args = iter(argv)
    for arg in args:
        if arg != "--config" and not arg.startswith("--config="):
            rest.append(arg)
            continue
        path = arg.partition("=")[2] or next(args, "")
        if is_search_space(Path(path)):
            spaces.append(Path(path))
        else:
            rest += ["--config", path]
    if len(spaces) > 1:
        raise ConfigError(f"give one search space, got {', '.join(map(str, spaces))}")
    if not spaces and not DEFAULT_SPACE.is_file():
        raise ConfigError(f"no search space: {DEFAULT_SPACE} is missing; give --config <file>.yaml")
    return (spaces[0] if spaces else DEFAULT_SPACE), rest


def is_search_space(path: Path) -> bool:
    """A file train.py's parser will report on (missing, not YAML) is not the search space."""
    try:
        content = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(content, dict) and any(key in content for key in SPACE_KEYS)


def read_space(path: Path, seed_offset: int = 0) -> Any:
    """metric, direction, sampler and pruner (Optuna classes by class_path), params.

    A sampler's seed, when it has one, is moved on by `seed_offset`.
    """
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--metric", type=str | None, default=None)
    parser.add_argument("--direction", type=Literal["maximize", "minimize"] | None, default=None)
    sampler = {"class_path": "optuna.samplers.TPESampler", "init_args": {"seed": 0}}
    parser.add_argument("--sampler", type=BaseSampler, default=sampler)
    parser.add_argument("--pruner", type=BasePruner, default=lazy_instance(MedianPruner))
    parser.add_argument("--params", type=dict[str, dict[str, Any]], default={})
    parser.add_argument("--repeat", type=dict[str, Any] | None, default=None)
    try:
        config = parser.parse_path(path, defaults=True)
        if seed_offset and getattr(config.sampler.init_args, "seed", None) is not None:
            config.sampler.init_args.seed += seed_offset
        # jsonargparse 4.49 renamed instantiate_classes; this project admits 4.41.
        instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
        return instantiate(config)
    except Exception as error:
        raise ConfigError(f"{path}: {one_line(error)} (keys: {', '.join(SPACE_KEYS)})") from error


def distribution(key: str, spec: dict[str, Any]) -> BaseDistribution:
    """The Optuna distribution of one `params` entry: a range or a list of choices."""
    accepted = "{low: L, high: H} with optional log: true or step: S, or {choices: [...]}"
    if set(spec) == {"choices"} and isinstance(spec["choices"], list) and spec["choices"]:
        if not all(isinstance(c, str | int | float | bool) for c in spec["choices"]):
            raise ConfigError(f"params.{key}.choices must be plain values, got {spec['choices']}")
        return CategoricalDistribution(spec["choices"])
    if not {"low", "high"} <= set(spec) <= {"low", "high", "log", "step"}:
        raise ConfigError(f"params.{key} must be {accepted}; got {spec}")
    bounds = (spec["low"], spec["high"], spec.get("step"))
    if any(isinstance(b, bool) or not isinstance(b, int | float | None) for b in bounds):
        raise ConfigError(f"params.{key}: low, high and step must be numbers, got {spec}")
    integer = all(isinstance(b, int | None) for b in bounds)
    kind = IntDistribution if integer else FloatDistribution
    step = spec.get("step", 1 if integer else None)
    try:
        return kind(spec["low"], spec["high"], log=bool(spec.get("log", False)), step=step)
    except ValueError as error:
        raise ConfigError(f"params.{key}: {error}") from error


def check_train_args(sweep: Sweep) -> None:
    """Parse the train.py flags with each parameter's values, before any trial runs; fill in
    the metric and direction that the search space leaves to train.py's --monitor."""
    cli = parse_only(sweep.train_args)
    configured_loggers(sweep.train_args)  # each trial needs a logger with a run folder
    # The trials' metric: the search space's, else the one train.py's flags monitor.
    from_space = sweep.metric is not None
    if sweep.metric is None:
        sweep.metric = cli.config.monitor
    sweep.train_args = [*sweep.train_args, "--monitor", sweep.metric]
    # The model, built once as each trial will build it, refuses a metric it does not log and
    # says which way the metric is better.
    try:
        directions = metric_directions(build_model(sweep.train_args))
    except ConfigError as error:
        if from_space and str(error).startswith(f"--monitor {sweep.metric} "):
            # The space's metric, not a flag the user typed.
            said = str(error).removeprefix(f"--monitor {sweep.metric} ")
            raise ConfigError(f"metric {sweep.metric} in {sweep.space_file} {said}") from None
        raise
    if sweep.direction is None:
        sweep.direction = "maximize" if directions[sweep.metric] == "max" else "minimize"
    # Each value with the others at their first: a class choice meets its arguments' keys.
    first = {key: extremes(dist)[0] for key, dist in sweep.space.items()}
    for key, dist in sweep.space.items():
        for value in extremes(dist):
            try:
                cli.parser.parse_args([*sweep.train_args, *flags({**first, key: value})])
            except Exception as error:
                raise ConfigError(
                    f"train.py rejects params.{key} = {value!r}: {one_line(error)}"
                ) from error


def extremes(dist: BaseDistribution) -> tuple[Any, ...]:
    """Every choice, or both ends of a range."""
    if isinstance(dist, CategoricalDistribution):
        return dist.choices
    return dist.low, dist.high


def flags(values: dict[str, Any]) -> list[str]:
    """Command-line flags for parameter values (strings as they are, the rest as JSON)."""
    return [
        arg
        for key, value in values.items()
        for arg in (f"--{key}", value if isinstance(value, str) else json.dumps(value))
    ]
