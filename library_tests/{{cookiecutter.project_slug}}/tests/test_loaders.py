"""The library's loaders: pinned memory and kept workers, workers from a fork server that
imports only what they need, the default worker count, workers seeded per process, and workers
that outlive a SIGTERM or the end of their process."""

import functools
import gc
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from lightning import Trainer

from {{ cookiecutter.package_name }}.data import DataModule
from {{ cookiecutter.package_name }}.kit.datamodule import modules_of


def test_loaders_pin_memory_only_on_gpu_and_keep_workers(
    make_datamodule: Callable[..., DataModule],
) -> None:
    dm = make_datamodule(num_workers=1)
    dm.trainer = Trainer(accelerator="cpu", devices=1, logger=False)
    dm.prepare_data()
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.pin_memory is False
    assert loader.persistent_workers is True
    assert loader.num_workers == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a fork server on Linux only")
def test_workers_start_from_a_fork_server(make_datamodule: Callable[..., DataModule]) -> None:
    """Forked from the training process, which runs other threads, a worker can hang at start."""
    dm = make_datamodule(num_workers=1)
    dm.prepare_data()
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    images, labels = next(iter(loader))
    assert len(images) == len(labels) > 0


def test_default_workers_are_a_share_of_the_cpus(
    make_datamodule: Callable[..., DataModule],
) -> None:
    assert make_datamodule(num_workers=None).num_workers >= 1


def test_default_workers_leave_cpus_to_every_process_of_the_run(
    make_datamodule: Callable[..., DataModule], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(8)), raising=False)
    default, given = make_datamodule(num_workers=None), make_datamodule(num_workers=6)
    assert default.num_workers == 4  # one process: half of the 8 CPUs
    for devices, workers in ((2, 3), (4, 1)):  # Lightning's bound: 8 // devices - 1
        default.trainer = given.trainer = Trainer(accelerator="cpu", devices=devices, logger=False)
        assert default.num_workers == workers
        assert given.num_workers == 6  # as given


def fork_servers() -> list[int]:
    """The fork servers this process started (multiprocessing does not list them)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue  # ended meanwhile
        if parent == os.getpid() and b"forkserver" in command:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a fork server on Linux only")
def test_a_sigterm_from_another_process_leaves_loader_workers_running(
    make_datamodule: Callable[..., DataModule],
) -> None:
    """A SIGTERM to the whole job reaches the workers and their fork server too: the main
    process stops the workers itself after saving. Workers the signal killed would make it
    fail; a fork server it killed would make it take running workers for ended (exit status
    255) and exit under them."""
    datamodule = make_datamodule(num_workers=1, batch_size=4)
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    # Only this loader's workers: processes earlier tests left running are not signalled.
    earlier = set(multiprocessing.active_children())
    batches = iter(loader)
    next(batches)
    workers = [child for child in multiprocessing.active_children() if child not in earlier]
    servers = fork_servers()
    assert workers and servers
    for pid in [*servers, *(worker.pid for worker in workers)]:
        # Sent by `kill`, as `kill -- -PGID` or a scheduler would.
        subprocess.run(["kill", "-s", "TERM", str(pid)], check=True)
    time.sleep(1)
    assert fork_servers() == servers
    assert all(worker.is_alive() for worker in workers)
    # Other processes from the same server end on SIGTERM, as processes do.
    other = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(60,))
    other.start()
    other.terminate()
    other.join(timeout=10)
    assert other.exitcode == -signal.SIGTERM
    assert sum(1 for _ in batches) == len(loader) - 1
    del batches, loader  # the workers stop here, not in a later test
    gc.collect()
    for worker in workers:
        worker.join(timeout=10)  # told to stop, or terminated: either way, they end
    assert not any(worker.is_alive() for worker in workers)


def test_a_process_ends_with_loader_workers_still_running(
    data_args: list[str], tmp_path: Path
) -> None:
    """At exit, multiprocessing ends the workers with SIGTERM from their main process."""
    script = tmp_path / "exit_with_workers.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import fake_data\n"
        "getattr(fake_data, 'trust_local_files', lambda: None)()  # the tiny CIFAR-10 files\n"
        "from {{ cookiecutter.package_name }}.kit.cli import build_cli\n"
        "from {{ cookiecutter.package_name }}.kit.project import use\n"
        "from {{ cookiecutter.package_name }}.project import project\n"
        "use(project)  # as the entry scripts do\n"
        "if __name__ == '__main__':  # loader workers start from a server that imports this\n"
        "    cli = build_cli(sys.argv[1:])\n"
        "    cli.datamodule.setup('fit')\n"
        "    loader = cli.datamodule.train_dataloader()\n"
        "    batches = iter(loader)\n"
        "    next(batches)\n"
        "    print('one batch', flush=True)\n"
    )
    ended = subprocess.run(
        [sys.executable, str(script), *data_args, "--data.num_workers", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ended.returncode == 0, ended.stderr[-3000:]
    assert "one batch" in ended.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a fork server on Linux only")
def test_workers_import_neither_lightning_nor_the_training_code(
    data_args: list[str], tmp_path: Path
) -> None:
    """The workers' fork server imports what the workers are sent and kit/workers.py, and a
    script that imports under its main guard (as the entry scripts do): starting it costs what
    importing torch and the data's own libraries costs, not the training program's start-up."""
    script = tmp_path / "report_worker_modules.py"
    script.write_text(
        "import json\n"
        "import os\n"
        "import sys\n"
        "def report(worker_id):\n"
        "    with open(os.environ['REPORT'], 'w') as file:\n"
        "        json.dump(sorted(sys.modules), file)\n"
        "if __name__ == '__main__':\n"
        f"    sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "    import fake_data\n"
        "    getattr(fake_data, 'trust_local_files', lambda: None)()\n"
        "    from {{ cookiecutter.package_name }}.kit.cli import build_cli\n"
        "    from {{ cookiecutter.package_name }}.kit.project import use\n"
        "    from {{ cookiecutter.package_name }}.project import project\n"
        "    use(project)\n"
        "    cli = build_cli(sys.argv[1:])\n"
        "    cli.datamodule.setup('fit')\n"
        "    loader = cli.datamodule.train_dataloader()\n"
        "    loader.worker_init_fn = report\n"
        "    next(iter(loader))\n"
    )
    report = tmp_path / "modules.json"
    ended = subprocess.run(
        [sys.executable, str(script), *data_args, "--data.num_workers", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "REPORT": str(report)},
    )  # fmt: skip
    assert ended.returncode == 0, ended.stderr[-3000:]
    imported = json.loads(report.read_text())
    assert "torch" in imported
    assert [name for name in imported if name.split(".")[0] == "lightning"] == []
    assert "{{ cookiecutter.package_name }}.kit.train" not in imported


def report_seeds(path: Path, start: Callable[[int], None], worker_id: int) -> None:
    """The worker's set-up, then the state of its three generators, into `path`."""
    start(worker_id)
    path.write_text(json.dumps([torch.initial_seed(), random.random(), np.random.random()]))


def worker_seeds(datamodule: DataModule, rank: int, path: Path, state: dict | None = None) -> Any:
    """The seeds a worker of the training loader gets in the process of rank `rank` (a run's
    loader restored from `state`, as a resumed run's): (seeds, the loader's state then)."""
    cpu = SimpleNamespace(root_device=torch.device("cpu"))
    datamodule.trainer = SimpleNamespace(global_rank=rank, num_devices=2, strategy=cpu)
    loader = datamodule.make_loader(datamodule.train_set, shuffle=True)
    loader.worker_init_fn = functools.partial(report_seeds, path, loader.worker_init_fn)
    if state is not None:
        loader.load_state_dict(state)
    batches = iter(loader)
    next(batches)
    seeds, state = json.loads(path.read_text()), loader.state_dict()
    del batches, loader
    gc.collect()
    return seeds, state


def test_the_processes_of_a_run_give_their_workers_different_seeds(
    make_datamodule: Callable[..., DataModule], tmp_path: Path
) -> None:
    """The loader seeds each worker's torch, random and NumPy from its own generator; the
    process's rank joins in the worker, so the processes of a run augment differently, also
    after a resume (which gives every process the first one's loader state)."""
    datamodule = make_datamodule(num_workers=1)
    datamodule.setup("fit")
    first, state = worker_seeds(datamodule, 0, tmp_path / "first.json")
    second, _ = worker_seeds(datamodule, 1, tmp_path / "second.json")
    again, _ = worker_seeds(datamodule, 0, tmp_path / "again.json")
    assert all(a != b for a, b in zip(first, second, strict=True))
    assert again == first  # the same process: the same seeds
    resumed_first, _ = worker_seeds(datamodule, 0, tmp_path / "resumed_first.json", state)
    resumed_second, _ = worker_seeds(datamodule, 1, tmp_path / "resumed_second.json", state)
    assert all(a != b for a, b in zip(resumed_first, resumed_second, strict=True))


def test_the_fork_server_is_told_the_modules_of_what_the_workers_are_sent(
    make_datamodule: Callable[..., DataModule],
) -> None:
    datamodule = make_datamodule(num_workers=1)
    datamodule.setup("fit")
    found = modules_of([datamodule.train_set, datamodule.collate_fn, datamodule.worker_init()])
    assert "{{ cookiecutter.package_name }}.kit.workers" in found
    assert type(datamodule.train_set).__module__ in found
    assert not [name for name in found if name.split(".")[0] == "lightning"]
    assert modules_of([lambda: None]) == []  # the loader itself will say it cannot pickle it
