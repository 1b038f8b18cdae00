"""Training-step time of the default network of rendered projects, side by side.

    python benchmarks/step_time.py --input-shape 1 28 28 OLD_RENDER NEW_RENDER

Each project is a rendered project folder, for example one dataset rendered from two
versions of the template (`git worktree add build/before <commit>` gives the older one).
Every round starts one process per project, in turn, so drift of a shared machine spreads
over all of them alike; each process builds the project's model with its defaults
(`ImageClassifier(num_classes, input_shape)`: default backbone, channels-last weights where
that is the default), then times forward, loss, backward and an AdamW step on a random
batch, after untimed warm-up steps. Prints one line per project: milliseconds per step,
median over rounds (min to max).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORKER = """
import json, sys, time
import torch
from {package}.model import ImageClassifier

torch.manual_seed(0)
shape, batch_size, steps = {shape}, {batch_size}, {steps}
model = ImageClassifier({num_classes}, shape)
network, loss_fn = model.backbone, model.loss
optimizer = torch.optim.AdamW(network.parameters())
x = torch.randn(batch_size, *shape)
y = torch.randint(0, {num_classes}, (batch_size,))


def step():
    optimizer.zero_grad(set_to_none=True)
    loss_fn(network(x), y).backward()
    optimizer.step()


for _ in range(3):
    step()
start = time.perf_counter()
for _ in range(steps):
    step()
print(json.dumps((time.perf_counter() - start) / steps * 1000))
"""


def package_of(project: Path) -> str:
    packages = [p.name for p in (project / "src").iterdir() if (p / "model.py").is_file()]
    if len(packages) != 1:
        sys.exit(f"{project}: expected one package with a model.py under src/, found {packages}")
    return packages[0]


def time_one(project: Path, options: argparse.Namespace) -> float:
    script = WORKER.format(
        package=package_of(project),
        shape=tuple(options.input_shape),
        batch_size=options.batch_size,
        steps=options.steps,
        num_classes=options.num_classes,
    )
    env = {**os.environ, "PYTHONPATH": str(project / "src")}  # this render, not another
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.exit(f"{project}: the timing process failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("projects", type=Path, nargs="+")
    parser.add_argument("--input-shape", type=int, nargs=3, required=True, metavar=("C", "H", "W"))
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args(argv)
    for project in options.projects:
        if not (project / "src").is_dir():
            parser.error(f"{project} is not a rendered project (it has no src/ folder)")
    times: dict[str, list[float]] = {str(p): [] for p in options.projects}
    for round_ in range(options.rounds):
        # Each round starts one project later than the one before.
        shift = round_ % len(options.projects)
        for project in options.projects[shift:] + options.projects[:shift]:
            times[str(project)].append(time_one(project, options))
    for project, values in times.items():
        low, high = min(values), max(values)
        print(f"{statistics.median(values):8.1f} ms/step  ({low:.1f} to {high:.1f})  {project}")
    return times


if __name__ == "__main__":
    started = time.perf_counter()
    result = main()
    print(json.dumps({"seconds": round(time.perf_counter() - started, 1), "ms_per_step": result}))
