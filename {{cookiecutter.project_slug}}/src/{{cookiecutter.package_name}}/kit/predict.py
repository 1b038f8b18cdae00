"""Classify input files (the project's inputs module reads them) with a checkpoint or an
exported artifact.

python predict.py --model runs/default/version_<N>/export/best.onnx images/ cat.png
python predict.py --model best.ckpt images/ --output preds.csv     (or .json)

An input that cannot be decoded is reported by name and the others are still
predicted; the exit status is 1 if any input failed.
"""

import csv
import json
import sys
from pathlib import Path

from jsonargparse import ArgumentParser

from .errors import ConfigError, UnreadableInputError
from .inference import Classifier, load_classifier, stack
from .project import Inputs

OUTPUT_SUFFIXES = (".csv", ".json")
Row = dict[str, str | float | None]


def input_files(inputs: list[Path], reader: Inputs) -> list[Path]:
    """The files given, and the input files found under the folders given, in sorted order."""
    files = []
    for path in inputs:
        if path.is_dir():
            found = reader.files_in(path)
            if not found:
                raise ConfigError(f"{path} holds no {reader.ACCEPTED}")
            files += found
            left_out = sorted(set(filter(Path.is_file, path.rglob("*"))) - set(found))
            if left_out:  # said, so that a file of an unexpected type is not missed unnoticed
                print(
                    f"{path}: {len(left_out)} file(s) left out, not {reader.ACCEPTED} "
                    f"(such as {left_out[0].name})",
                    file=sys.stderr,
                )
        elif path.is_file():
            files.append(path)
        else:
            raise ConfigError(f"{path} is neither a file nor a folder")
    return files


def predict(classifier: Classifier, files: list[Path], batch_size: int = 64) -> list[Row]:
    """One row per file: the predicted class and its probability, or why it failed."""
    rows: list[Row] = []
    readable = []
    for path in files:
        row: Row = {"file": str(path), "class": None, "probability": None, "error": None}
        try:
            readable.append((row, classifier.input_of(path)))
        except UnreadableInputError as error:
            row["error"] = str(error)
        rows.append(row)
    for start in range(0, len(readable), batch_size):
        chunk = readable[start : start + batch_size]
        probabilities = classifier.probabilities(stack([image for _, image in chunk]))
        for (row, _), one in zip(chunk, probabilities, strict=True):
            best = int(one.argmax())
            row["class"], row["probability"] = classifier.class_names[best], float(one[best])
    return rows


def table(rows: list[Row]) -> str:
    width = max(len("file"), *(len(str(row["file"])) for row in rows))
    lines = [f"{'file':<{width}}  {'class':<16} probability"]
    for row in rows:
        if row["error"]:
            lines.append(f"{row['file']:<{width}}  error: {row['error']}")
        else:
            lines.append(f"{row['file']:<{width}}  {row['class']:<16} {row['probability']:.4f}")
    return "\n".join(lines)


def write(rows: list[Row], output: Path) -> None:
    if output.suffix == ".json":
        output.write_text(json.dumps(rows, indent=2) + "\n")
        return
    with output.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main(args: list[str] | None = None) -> int:
    """Print (or write) the predictions; return 1 if any input failed, else 0."""
    parser = ArgumentParser(description="Classify files with a checkpoint or an exported model.")
    parser.add_argument("--model", type=Path, required=True, help=".ckpt, .onnx, .pt2 or .pt file")
    parser.add_argument("--output", type=Path | None, default=None, help="preds.csv or preds.json")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("inputs", nargs="+", type=Path, help="Files or folders.")
    config = parser.parse_args(args)
    try:
        if config.output and config.output.suffix not in OUTPUT_SUFFIXES:
            raise ConfigError(
                f"--output {config.output} must end in {' or '.join(OUTPUT_SUFFIXES)}"
            )
        if config.output and not config.output.parent.is_dir():  # said before predicting
            raise ConfigError(f"--output {config.output}: {config.output.parent} is not a folder")
        if config.batch_size < 1:
            raise ConfigError(f"--batch_size must be a positive integer, got {config.batch_size}")
        classifier = load_classifier(config.model)
        files = input_files(config.inputs, classifier.inputs)
    except ConfigError as error:
        sys.exit(f"error: {error}")
    rows = predict(classifier, files, config.batch_size)
    print(table(rows))
    if config.output:
        write(rows, config.output)
        print(f"Predictions written to {config.output}")
    failed = sum(1 for row in rows if row["error"])
    if failed:
        print(f"{failed} of {len(rows)} inputs could not be read", file=sys.stderr)
    return 1 if failed else 0
