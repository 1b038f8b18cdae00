"""For the shards tests: what each process trained on, what the cache holds; a conversion
that dies part of the way."""

import hashlib
import json
import os
import signal
from pathlib import Path

import lightning as L
from torch import Tensor

from {{ cookiecutter.package_name }} import shards
from {{ cookiecutter.package_name }}.data import eval_transform


class RecordSamples(L.Callback):
    """Writes, per epoch and process, a fingerprint of each training image it was given.

    Training is switched to the evaluation transform, so that an image's tensor names its file.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.seen: list[str] = []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        data = trainer.datamodule
        data.train_set.image_transform = eval_transform(data.image_size)

    def on_train_batch_start(self, _: L.Trainer, __: object, batch: tuple, *___: object) -> None:
        images, _ = batch
        self.seen += [fingerprint(image) for image in images]

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"epoch{trainer.current_epoch}_rank{trainer.global_rank}.json"
        (self.folder / name).write_text(json.dumps(self.seen))
        self.seen = []


def fingerprint(image: Tensor) -> str:
    return hashlib.sha256(image.contiguous().numpy().tobytes()).hexdigest()


class CacheSize(L.Callback):
    """Records after every training step the bytes of the shards in a cache folder; writes
    them to <folder>_sizes.json at the end."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.sizes: list[int] = []

    def on_train_batch_end(self, *_: object) -> None:
        self.sizes.append(sum(p.stat().st_size for p in self.folder.rglob("*.bin")))

    def on_train_end(self, *_: object) -> None:
        target = self.folder.with_name(f"{self.folder.name}_sizes.json")
        target.write_text(json.dumps(self.sizes))


def encode_until_stop(sample: list) -> dict:
    """shards.encode, until the file named by $STOP_AT: there the conversion is killed, all of
    it ($STOP=group: a Ctrl-C or a scheduler's kill) or only this worker process."""
    if sample[0] == os.environ["STOP_AT"]:
        os.killpg(os.getpgid(0), signal.SIGKILL) if os.environ["STOP"] == "group" else None
        os.kill(os.getpid(), signal.SIGKILL)
    return shards.encode(sample)
