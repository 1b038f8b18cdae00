"""What a loader worker runs, and what a conversion into shards runs in its worker processes
(`file_sample`). It imports torch only: never Lightning or the training code.

Loader workers start from a fork server (`ImageDataModule.worker_server`) that imports this
module and the modules of what the loader sends its workers (the dataset, its transforms, the
collate function), so that starting it costs about what importing torch and the data's own
libraries costs, not the whole training program's start-up a second time.

The server runs with SIGTERM blocked, so that a SIGTERM to the whole process group does not
end it; the processes it forks start as any other process does, with SIGTERM unblocked
(a loader worker then blocks it in `start_worker` and waits for its main process's).
"""

import os
import random
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

Batch = tuple[Tensor, Tensor]

os.register_at_fork(
    after_in_child=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
)


def start_worker(worker_id: int, main_process: int, rank: int = 0) -> None:
    """Set up a loader worker: SIGTERM ends it only when its main process sends it, and the
    worker's random numbers differ from those of the other processes' workers.

    A SIGTERM to every process of the job (`kill -- -PGID`, `timeout`, a scheduler's time
    limit) would otherwise kill the workers first, and the main process would fail on a dead
    worker wherever it is instead of saving a checkpoint and stopping (a search would record
    the trial as crashed). The main process ends its workers itself; a worker whose main
    process died exits within seconds (the loader's own watchdog).

    The loader has seeded the worker's torch, random and NumPy from its base seed and the
    worker's id. The base seed is the same in every process of a run (each draws it from a
    generator seeded alike, and a resumed run restores the first process's), so the process's
    rank joins it here: the processes augment differently, and a resumed run as before.
    """
    if hasattr(signal, "sigwaitinfo"):  # Linux; elsewhere the default stays
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        threading.Thread(target=wait_for_sigterm, args=(main_process,), daemon=True).start()
    if rank:  # the first process keeps the loader's seeds, as a single process does
        state = np.random.SeedSequence([torch.initial_seed(), rank]).generate_state(4)
        torch.manual_seed(int(state[0]) << 32 | int(state[1]))
        random.seed(int(state[2]))
        np.random.seed(state)


def wait_for_sigterm(main_process: int) -> None:
    """Exit on a SIGTERM from the main process (which ends its workers that way at exit)."""
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == main_process:
            os._exit(0)


class TensorImages(Dataset):
    """Images decoded once into one uint8 tensor (N, C, H, W), with their labels.

    The loader asks for whole batches (`__getitems__`): one indexing operation per batch
    instead of a Python call and a transform per image.
    """

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> Batch:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: list[int]) -> Batch:
        index = torch.as_tensor(indices)
        return self.images[index], self.labels[index]


def whole_batch(batch: Batch) -> Batch:
    """The collate function of `TensorImages`: `__getitems__` already returns the batch."""
    return batch


def file_sample(sample: list) -> dict[str, Any]:
    """One shard item from a (file, label) pair: the file's bytes as they are (still encoded),
    its label, and the file it came from, to name it (as bytes: LitData stores a text that
    names an image file as that file's pixels). LitData's `optimize` spawns its workers, and
    each imports the module of the function it runs: here, that costs torch, not Lightning."""
    path, label = sample
    return {"image": Path(path).read_bytes(), "label": label, "file": path.encode()}
