"""From `cookiecutter` to a served prediction, timed by stage.

    python benchmarks/journey.py [--rounds 3] [--workdir build/journey]

Each round: render the default project, `python train.py`, `python export.py --format onnx`,
`python serve.py --model <the .onnx file>` until /health answers, then one HTTP prediction of
a real digit image (the first of the test split, which the server must classify right). Every
command runs as the README shows it, in the project folder, with this environment's packages
(the `pip install -e .` of a first install is not timed). Prints one line per stage and the
total, in seconds, median over rounds (min to max); `make bench` adds them to its table.
"""

import argparse
import base64
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from cookiecutter.main import cookiecutter

REPO = Path(__file__).resolve().parents[1]
STAGES = ("render", "train", "export", "server up", "prediction")
TARGET_S = 15.0  # the whole journey
# One image of the project's own test split, as a PNG file a user would send: the digits'
# 0..16 values spread over 0..255, light ink on dark, as the README asks.
DIGIT_PNG = """
import sys
from PIL import Image
from proj.data import DataModule

data = DataModule()
data.setup("test")
image, label = data.test_set[0]
pixels = (image[0].float() * 255 / 16).round().clamp(0, 255).byte().numpy()
Image.fromarray(pixels, mode="L").save(sys.argv[1])
print(int(label))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python(project: Path, *args: str) -> str:
    """Run a Python command in the project as a user would; its output (stops on failure)."""
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    done = subprocess.run(
        [sys.executable, *args], cwd=project, env=env, capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(f"{' '.join(args[:2])} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return done.stdout


def request(url: str, body: bytes | None = None) -> bytes:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=10) as r:
        return r.read()


def one_round(workdir: Path, train_args: list[str]) -> dict[str, float]:
    """The journey once; the seconds of each stage."""
    shutil.rmtree(workdir, ignore_errors=True)
    times: dict[str, float] = {}
    started = time.perf_counter()
    context = {"project_name": "journey", "package_name": "proj"}
    project = Path(
        cookiecutter(str(REPO), no_input=True, output_dir=str(workdir), extra_context=context)
    )
    times["render"] = time.perf_counter() - started

    started = time.perf_counter()
    python(project, "train.py", *train_args)
    times["train"] = time.perf_counter() - started

    started = time.perf_counter()
    exported = python(project, "export.py", "--format", "onnx")
    times["export"] = time.perf_counter() - started
    (model,) = {Path(p) for p in re.findall(r"\S+\.onnx\b", exported) if (project / p).is_file()}

    image = workdir / "digit.png"
    label = python(project, "-c", DIGIT_PNG, str(image)).strip()
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    command = [sys.executable, "serve.py", "--model", str(model), "--port", str(port)]
    started = time.perf_counter()
    server = subprocess.Popen(
        command, cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        while True:
            if server.poll() is not None:
                sys.exit(f"serve.py exited with status {server.returncode} before it was up")
            try:
                if request(f"http://127.0.0.1:{port}/health").strip(b'"') == b"ok":
                    break
            except OSError:
                time.sleep(0.05)
        times["server up"] = time.perf_counter() - started

        started = time.perf_counter()
        body = json.dumps({"image": base64.b64encode(image.read_bytes()).decode()}).encode()
        answer = json.loads(request(f"http://127.0.0.1:{port}/predict", body))
        times["prediction"] = time.perf_counter() - started
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    if answer["class"] != label:
        sys.exit(f"the server said {answer['class']!r} for a digit {label}: {answer}")
    times["total"] = sum(times.values())
    return times


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "journey")
    parser.add_argument(
        "--max-epochs", type=int, default=None, help="train.py --max_epochs (a quick check)"
    )
    options = parser.parse_args(argv)
    train_args = [] if options.max_epochs is None else ["--max_epochs", str(options.max_epochs)]
    rounds = [one_round(options.workdir, train_args) for _ in range(options.rounds)]
    results = {stage: [r[stage] for r in rounds] for stage in (*STAGES, "total")}
    for stage, values in results.items():
        print(
            f"{stage:>11}: {statistics.median(values):6.2f} s "
            f"({min(values):.2f} to {max(values):.2f})"
            + (f"   target: at most {TARGET_S:g} s" if stage == "total" else "")
        )
    return results


if __name__ == "__main__":
    main()
