"""Train the project's default model and data for a fixed number of steps at each precision on
one CUDA GPU; print samples per second. Exits 0 with a message when no CUDA GPU is present."""

import argparse
import time

import lightning as L
import torch

from .cli import build_cli
from .runs import release

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class StepTimer(L.Callback):
    """Times training steps after the first `warmup` ones (kernel selection, caches)."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.steps, self.start = warmup, 0, 0.0

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        self.steps += 1
        if self.steps == self.warmup:
            synchronize()
            self.start = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        synchronize()
        self.seconds = time.perf_counter() - self.start


def samples_per_second(
    precision: str, steps: int, batch_size: int, accelerator: str = "gpu"
) -> float:
    """Train the default model and data for `steps` steps; samples per second after warmup."""
    timer = StepTimer(warmup=min(20, steps // 4))
    # The model and data as train.py builds them: the project's configs/default.yaml.
    flags = ["--accelerator", "cpu", "--devices", "1", "--data.batch_size", str(batch_size)]
    cli = build_cli(flags)
    model, datamodule = cli.model, cli.datamodule
    release(cli)
    trainer = L.Trainer(
        accelerator=accelerator,
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


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Samples per second of the default model and data at each precision."
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=256)
    options = parser.parse_args(args)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU found; nothing to measure.")
        return 0
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    results = {p: samples_per_second(p, options.steps, options.batch_size) for p in PRECISIONS}
    print(f"\n{'precision':<12} {'samples/s':>12}")
    for precision, rate in results.items():
        print(f"{precision:<12} {rate:>12,.0f}")
    return 0
