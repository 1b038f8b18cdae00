"""Runs side by side: a table of runs, the difference of two configs, a paired comparison.

python results.py                         every run under runs/, best first by test/acc
python results.py runs/repeats --metric test/loss --format markdown
python results.py --diff RUN_A RUN_B      the config keys that differ between two runs
python results.py --compare REPEAT_A REPEAT_B    paired over the same seeds or folds

A run is a folder holding config.yaml (train.py writes one into each); its metrics are the
test metrics of its best checkpoint (test_metrics.json) and the validation metrics of the
same epoch (val_metrics.json). The runs of one folder of repeated runs (repeat.py's,
or any other configuration run over seeds or folds) form one row, mean ± std.
"""

import argparse
import csv
import io
import json
import math
import re
import statistics
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from scipy import stats

from .errors import ConfigError
from .records import DIRECTIONS, flatten

# Config keys that differ between any two runs without changing what is trained: where the
# run's folder is, which checkpoint a resume read, and how its progress was shown.
NOT_HYPERPARAMETERS = re.compile(
    r"^ckpt_path$|^trainer\.logger(\.\d+)?\.init_args\.(save_dir|name|version)$"
    r"|^progress_bar(\..+)?$|^trainer\.enable_progress_bar$"
)
FIRST_KEYS = ("seed_everything", "monitor", "init_from", "model.", "data.", "trainer.")
# The text table shows this many differing keys; csv and markdown show all.
TEXT_COLUMNS = 8
# Within a repeat these vary on purpose; its row shows the rest.
REPEATED = ("seed_everything", "data.init_args.fold")


def run_metrics(run: Path) -> dict[str, float] | None:
    """The test metrics of a run's best checkpoint and the validation metrics of its epoch;
    None for a run that has not finished."""
    tested = run / "test_metrics.json"
    if not tested.is_file():
        return None
    metrics = json.loads(tested.read_text())
    validated = run / "val_metrics.json"
    if validated.is_file():
        metrics.update(json.loads(validated.read_text()))
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and "/" in k}


def describe(values: Sequence[float]) -> dict[str, float]:
    """Count, mean, sample standard deviation and the half-width of the mean's 95% interval
    (Student's t: a handful of runs is not a normal sample), min and max."""
    n = len(values)
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if n > 1 else 0.0
    ci95 = float(stats.t.ppf(0.975, n - 1)) * std / math.sqrt(n) if n > 1 else math.nan
    return {"n": n, "mean": mean, "std": std, "ci95": ci95, "min": min(values), "max": max(values)}


def newest_finished(folder: Path) -> Path | None:
    """The newest version_<N> run folder under `folder` that finished."""
    done = [v for v in folder.glob("version_*") if run_metrics(v) is not None]
    return max(done, key=lambda v: int(v.name.split("_")[-1]), default=None)


def summarise(folder: Path, names: Sequence[str]) -> dict[str, Any]:
    """Per-run metrics of a repeat's runs and, for each metric, its statistics over them."""
    runs = {}
    for name in names:
        if (run := newest_finished(folder / name)) is not None:
            runs[name] = {"folder": str(run), **run_metrics(run)}
    keys = sorted({key for metrics in runs.values() for key in metrics if key != "folder"})
    described = {
        key: describe([m[key] for m in runs.values() if key in m])
        for key in keys
        if sum(key in m for m in runs.values()) == len(runs)
    }
    return {"folder": str(folder), "runs": runs, "metrics": described}


def summary_table(summary: dict[str, Any], form: str) -> str:
    """Each metric: mean ± std, the 95% interval of the mean, and every run's value."""
    names = list(summary["runs"])
    header = ["metric", "mean ± std", "95% CI", *names]
    rows = []
    for key, d in summary["metrics"].items():
        interval = f"{d['mean'] - d['ci95']:.4f} .. {d['mean'] + d['ci95']:.4f}"
        values = [f"{summary['runs'][name][key]:.4f}" for name in names]
        rows.append([key, f"{d['mean']:.4f} ± {d['std']:.4f}", interval, *values])
    return render(header, rows, form)


def render(header: list[str], rows: list[list[str]], form: str) -> str:
    """A table as aligned text, markdown or CSV."""
    if form == "csv":
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows([header, *rows])
        return out.getvalue().rstrip("\n")
    if form == "markdown":
        lines = [header, ["---"] * len(header), *rows]
        return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [header, *rows]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in lines
    )


def flat_config(run: Path) -> dict[str, str]:
    """A run's config.yaml as dotted keys and their values (lists and classes included)."""
    config = run / "config.yaml" if run.is_dir() else run
    if not config.is_file():
        raise ConfigError(f"{run} holds no config.yaml (a run folder of train.py does)")
    flat = flatten(yaml.safe_load(config.read_text()) or {})
    return {
        key: value if isinstance(value, str) else json.dumps(value)
        for key, value in flat.items()
        if not NOT_HYPERPARAMETERS.match(key)
    }


def diff(first: Path, second: Path) -> list[str]:
    """One line per config key that differs: changed, only in the first, only in the second."""
    a, b = flat_config(first), flat_config(second)
    lines = []
    for key in sorted(a.keys() | b.keys()):
        if key not in b:
            lines.append(f"- {key}: {a[key]}")
        elif key not in a:
            lines.append(f"+ {key}: {b[key]}")
        elif a[key] != b[key]:
            lines.append(f"  {key}: {a[key]} -> {b[key]}")
    return lines


def mode_of(metric: str, runs: Sequence[Path]) -> str:
    """'max' for a metric that is better higher, as the runs recorded it (test/x follows
    val/x); by its name for runs that recorded none: a loss is better lower."""
    wanted = "val/" + metric.split("/", 1)[-1]
    for run in runs:
        recorded = run / DIRECTIONS
        if recorded.is_file() and wanted in (directions := json.loads(recorded.read_text())):
            return directions[wanted]
    return "min" if "loss" in metric else "max"


def short(key: str) -> str:
    """A config key without the class-argument level: model.optimizer.lr."""
    return key.replace(".init_args.", ".")


def callbacks_last(key: str) -> tuple[bool, str]:
    return not key.startswith(FIRST_KEYS), key


def find_runs(roots: Sequence[Path]) -> list[Path]:
    """Every finished run folder under the roots (a folder with config.yaml and metrics)."""
    found = set()
    for root in roots:
        if not root.exists():
            raise ConfigError(f"{root} does not exist; give a folder of runs (default: runs)")
        configs = [root / "config.yaml"] if (root / "config.yaml").is_file() else []
        found |= {c.parent for c in [*configs, *root.rglob("*/config.yaml")]}
    return sorted(run for run in found if run_metrics(run) is not None)


def entries(runs: list[Path], roots: Sequence[Path] = ()) -> list[dict[str, Any]]:
    """Rows of the table: a single run, or the runs of one repeat (repeat.json) together; a
    repeat's run alone when the folders asked for (`roots`) hold that run, not its repeat."""
    groups: dict[Path, list[Path]] = {}
    for run in runs:
        repeat = run.parent.parent
        whole = not roots or any(repeat.resolve().is_relative_to(r.resolve()) for r in roots)
        key = repeat if whole and (repeat / "repeat.json").is_file() else run
        groups.setdefault(key, []).append(run)
    rows = []
    for folder, members in groups.items():
        metrics = [run_metrics(run) or {} for run in members]
        keys = set.intersection(*(set(m) for m in metrics))
        config = flat_config(members[0])
        if len(members) > 1 or folder != members[0]:
            config = {k: v for k, v in config.items() if k not in REPEATED}
        rows.append(
            {
                "folder": folder,
                "date": max((run / "config.yaml").stat().st_mtime for run in members),
                "config": config,
                "metrics": {key: describe([m[key] for m in metrics]) for key in keys},
            }
        )
    return rows


def table(roots: Sequence[Path], metric: str, form: str) -> str:
    """The runs under `roots`, best first by `metric`, with the hyperparameters that differ."""
    found = find_runs(roots)
    rows = entries(found, roots)
    if not rows:
        return f"No finished runs under {', '.join(map(str, roots))} yet."
    if not any(metric in row["metrics"] for row in rows):
        known = sorted({key for row in rows for key in row["metrics"]})
        raise ConfigError(f"--metric {metric}: the runs have {', '.join(known)}")
    # The model's, the data's and the trainer's keys first, then the callbacks'.
    keys = sorted({key for row in rows for key in row["config"]}, key=callbacks_last)
    # A repeat's seeds and folds are left out of its row: no difference from a single run's.
    differ = [
        k
        for k in keys
        if len({row["config"].get(k) for row in rows if k in row["config"] or k not in REPEATED})
        > 1
    ]
    more = differ[TEXT_COLUMNS:] if form == "text" else []
    differ = differ[: len(differ) - len(more)]
    best_high = mode_of(metric, found) == "max"
    unknown = -math.inf if best_high else math.inf
    rows.sort(key=lambda r: r["metrics"].get(metric, {"mean": unknown})["mean"], reverse=best_high)
    tested = {key for row in rows for key in row["metrics"] if key.startswith("test/")}
    shown = [metric, *sorted(tested - {metric})]
    # A CSV file is read by other tools: numbers only, a repeat's spread in a column of its own.
    numbers = form == "csv"
    metric_columns = [c for key in shown for c in ([key, f"{key} std"] if numbers else [key])]
    header = ["run", "date", *map(short, differ), *metric_columns, "runs"]
    lines = []
    for row in rows:
        cells = [str(row["folder"]), datetime.fromtimestamp(row["date"]).strftime("%Y-%m-%d %H:%M")]
        cells += [row["config"].get(key, "-") for key in differ]
        for key in shown:
            d = row["metrics"].get(key)
            mean = "" if d is None else f"{d['mean']:.4f}"
            spread = f"{d['std']:.4f}" if d is not None and d["n"] > 1 else ""
            if numbers:
                cells += [mean, spread]
            else:
                cells.append((mean or "-") + (f" ± {spread}" if spread else ""))
        cells.append(str(max((d["n"] for d in row["metrics"].values()), default=1)))
        lines.append(cells)
    note = (
        f"\n{len(more)} more keys differ: {', '.join(map(short, more))} (--format csv "
        "shows them; --diff RUN_A RUN_B compares two runs)"
        if more
        else ""
    )
    return render(header, lines, form) + note


def compare(first: Path, second: Path, metric: str) -> str:
    """A paired comparison of two repeats over the seeds or folds both have."""
    runs, finished, known = [], [], set()
    for folder in (first, second):
        if not (folder / "repeat.json").is_file():
            raise ConfigError(
                f"{folder} holds no repeated runs (runs/repeats/<name>, or another folder of "
                "runs of one configuration over seeds or folds)"
            )
        newest = {child.name: run for child in folder.iterdir() if (run := newest_finished(child))}
        finished += newest.values()
        metrics = {name: run_metrics(run) or {} for name, run in newest.items()}
        known.update(key for values in metrics.values() for key in values)
        runs.append({name: values[metric] for name, values in metrics.items() if metric in values})
    if known and not any(runs):
        raise ConfigError(f"--metric {metric}: the runs have {', '.join(sorted(known))}")
    paired = sorted(runs[0].keys() & runs[1].keys())
    unpaired = [
        f"{', '.join(sorted(r.keys() - paired))} of {folder}"
        for r, folder in zip(runs, (first, second), strict=True)
        if r.keys() - paired
    ]
    if len(paired) < 2:
        raise ConfigError(
            f"{first} and {second} have {len(paired)} finished run(s) of the same seed or fold "
            f"with {metric}; a paired comparison needs 2 or more"
        )
    a, b = [[r[name] for name in paired] for r in runs]
    difference = describe([y - x for x, y in zip(a, b, strict=True)])
    spread = max(statistics.stdev(a), statistics.stdev(b))
    if difference["std"] > 0:
        test = f"paired t-test p = {float(stats.ttest_rel(b, a).pvalue):.3g}"
    else:  # the t statistic divides by that spread
        test = "no t-test: every pair differs by the same amount"
    better = "higher" if mode_of(metric, finished) == "max" else "lower"
    mean = difference["mean"]
    verdict = (
        f"larger than the seed-to-seed spread ({abs(mean):.4f} > {spread:.4f})"
        if abs(mean) > spread
        else f"within the seed-to-seed spread ({abs(mean):.4f} <= {spread:.4f}): no evidence"
    )
    left_out = f"  left out, finished in one folder only: {'; '.join(unpaired)}"
    return "\n".join(
        [
            f"{metric} over {len(paired)} paired runs ({', '.join(paired)}); {better} is better",
            f"  {first}: {statistics.fmean(a):.4f} ± {statistics.stdev(a):.4f}",
            f"  {second}: {statistics.fmean(b):.4f} ± {statistics.stdev(b):.4f}",
            f"  difference (second - first): {mean:+.4f} ± {difference['std']:.4f}, 95% CI "
            f"{mean - difference['ci95']:+.4f} .. {mean + difference['ci95']:+.4f}, {test}",
            f"  the difference is {verdict}",
            *([left_out] if unpaired else []),
        ]
    )


def command_line() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="results.py",
        description="List runs best first with the hyperparameters that differ; compare two.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "folders",
        nargs="*",
        type=Path,
        default=[Path("runs")],
        help="folders of runs (default: runs)",
    )
    parser.add_argument("--metric", default="test/acc", help="sort by (default: test/acc)")
    parser.add_argument(
        "--format",
        choices=("text", "markdown", "csv"),
        default="text",
        help="csv: numbers only, a repeat's standard deviation in a column of its own",
    )
    parser.add_argument(
        "--diff",
        nargs=2,
        type=Path,
        metavar="RUN",
        help="the config keys that differ between two run folders",
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar="REPEAT",
        help="paired comparison of two folders of repeated runs by --metric",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.diff:
            lines = diff(*args.diff)
            print("\n".join(lines) if lines else "The two configs are the same.")
        elif args.compare:
            print(compare(*args.compare, args.metric))
        else:
            print(table(args.folders, args.metric, args.format))
    except ConfigError as error:
        sys.exit(f"error: {error}")
