"""Train the default model and data for a fixed number of steps at each precision; print samples/s.

    python scripts/gpu_check.py [--steps 200] [--batch_size 256]

Exits 0 with a message when no CUDA GPU is present.
"""

import argparse
import sys
import time

import lightning as L
import torch

from {{ cookiecutter.package_name }}.data import DataModule
from {{ cookiecutter.package_name }}.kit.cli import build_model
from {{ cookiecutter.package_name }}.kit.project import use
from {{ cookiecutter.package_name }}.project import project

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")


class StepTimer(L.Callback):
    """Times training steps after the first `warmup` ones (kernel selection, caches)."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.steps, self.start = warmup, 0, 0.0

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        self.steps += 1
        if self.steps == self.warmup:
            torch.cuda.synchronize()
            self.start = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self.start


def samples_per_second(precision: str, steps: int, batch_size: int) -> float:
    """Train the default model and data for `steps` steps; samples per second after warmup."""
    timer = StepTimer(warmup=min(20, steps // 4))
    datamodule = DataModule(batch_size=batch_size)
    # The model as train.py builds it: configs/default.yaml's network and settings.
    model = build_model(["--accelerator", "cpu", "--devices", "1"])
    trainer = L.Trainer(
        accelerator="gpu",
        devices=1,
        precision=precision,
        max_steps=steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
    )
    trainer.fit(model, datamodule=datamodule)
    return (timer.steps - timer.warmup) * batch_size / timer.seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=256)
    options = parser.parse_args()
    use(project)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU found; nothing to measure.")
        return 0
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    results = {p: samples_per_second(p, options.steps, options.batch_size) for p in PRECISIONS}
    print(f"\n{'precision':<12} {'samples/s':>12}")
    for precision, rate in results.items():
        print(f"{precision:<12} {rate:>12,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
