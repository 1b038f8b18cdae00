"""The benchmark harness runs end to end on tiny settings (no timing is asserted)."""

import importlib.util
import json
import math

import pytest

from helpers import REPO


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], dict, str]:
    spec = importlib.util.spec_from_file_location("bench", REPO / "benchmarks" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    workdir = tmp_path_factory.mktemp("bench")
    out = workdir / "results.json"
    args = ["--quick", "--compare", "digits", "--loaders", "digits", "--workdir", str(workdir)]
    rows = module.main([*args, "--out", str(out)])
    return rows, json.loads(out.read_text()), module.table(rows)


def values(rows: list[dict], start: str) -> list[float]:
    return [row["median"] for row in rows if row["measure"].startswith(start)]


def test_every_question_is_measured_and_written(bench: tuple[list[dict], dict, str]) -> None:
    rows, written, table = bench
    assert written["rows"] == rows
    for start in (
        "digits: epoch, Trainer",
        "digits: epoch, plain loop, the project's data path",
        "digits: epoch, plain loop, classic",
        "digits: Trainer / plain loop (same data path)",
        "digits: Trainer per epoch, sum of fixed costs",
        "digits: Trainer, one drawing of the curves",
        "digits: cost per training step of progress bar",
        "start-up: python train.py --help",
        "start-up: import share",
        "loader digits: workers=0",
        "loader digits: classic workers=0",
    ):
        found = values(rows, start)
        assert found and all(math.isfinite(v) for v in found), start
    assert table.splitlines()[0] == "| measure | unit | median | min | max |"
    assert len(table.splitlines()) == len(rows) + 2


def test_trainer_and_plain_loop_reach_the_same_loss(bench: tuple[list[dict], dict, str]) -> None:
    # Same seed, initial weights, batch order and augmentation draws: the same losses.
    rows, _, _ = bench
    for kind in ("last-epoch train loss", "final val loss"):
        trainer = values(rows, f"digits: {kind}, Trainer")
        plain = values(rows, f"digits: {kind}, plain loop, the project's data path")
        assert trainer == pytest.approx(plain, rel=1e-3)
