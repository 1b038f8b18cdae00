{%- set folder = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST", "cifar10": "CIFAR10"}.get(cookiecutter.dataset, "MNIST") -%}
{%- if cookiecutter.dataset == "cifar10" -%}
"""Test data: a tiny CIFAR-10 written in its own on-disk format (pickled batches).

torchvision verifies the official files' MD5 sums; the tiny files cannot match
them, so the tests trust local files and everything else of the loader runs.
"""

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from torchvision.datasets import cifar

from {{ cookiecutter.package_name }}.data import CLASS_NAMES

PROJECT = Path(__file__).resolve().parents[1]
TRAIN_PER_BATCH, TEST_SIZE = 16, 40


def write_dataset(root: Path) -> list[str]:
    """Write cifar-10-batches-py/ under root; return the data arguments that select it."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    batches = [f"data_batch_{i}" for i in range(1, 6)]
    for name, size in [*[(b, TRAIN_PER_BATCH) for b in batches], ("test_batch", TEST_SIZE)]:
        labels = [i % len(CLASS_NAMES) for i in range(size)]
        data = rng.integers(0, 256, (size, 3 * 32 * 32), dtype=np.uint8)
        with open(folder / name, "wb") as f:
            pickle.dump({"data": data, "labels": labels, "batch_label": name}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": list(CLASS_NAMES), "num_cases_per_batch": TRAIN_PER_BATCH}, f)
    return ["--data.root", str(root)]


def files_are_there(self: cifar.CIFAR10) -> bool:
    """torchvision's check of the files, without their MD5 sums: a missing file still fails."""
    folder = Path(self.root) / self.base_folder
    return all((folder / name).is_file() for name, _ in [*self.train_list, *self.test_list])


def trust_local_files() -> None:
    """Accept the tiny files in place of the official ones (their MD5 sums differ)."""
    cifar.CIFAR10._check_integrity = files_are_there
    cifar.check_integrity = lambda path, md5=None: Path(path).is_file()


@pytest.fixture(autouse=True)
def offline_cifar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cifar.CIFAR10, "_check_integrity", files_are_there)
    monkeypatch.setattr(cifar, "check_integrity", lambda path, md5=None: Path(path).is_file())


@pytest.fixture(scope="session")
def data_args(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """CLI arguments that select the tiny test dataset (written once per session)."""
    return write_dataset(tmp_path_factory.mktemp("data"))


@pytest.fixture
def train_command(tmp_path: Path) -> list[str]:
    """The command that runs training in a subprocess, trusting the tiny local files."""
    script = tmp_path / "train_offline.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import fake_data\n"
        "from {{ cookiecutter.package_name }}.kit.train import main\n"
        "from {{ cookiecutter.package_name }}.kit.project import use\n"
        "from {{ cookiecutter.package_name }}.project import project\n"
        "use(project)  # as the entry scripts do\n"
        "fake_data.trust_local_files()  # also in processes that ddp_spawn starts\n"
        "if __name__ == '__main__':\n"
        "    main()\n"
    )
    return [sys.executable, str(script)]


@pytest.fixture
def bad_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Data arguments that must be refused: name -> (arguments, part of the message)."""
    # Nothing listens on the discard port: the download fails at once, as it does offline.
    monkeypatch.setattr(cifar.CIFAR10, "url", "http://127.0.0.1:9/cifar-10-python.tar.gz")
    (tmp_path / "empty").mkdir()
    return {
        "empty root, no network": (
            ["--data.root", str(tmp_path / "empty")],
            "could not be downloaded (",
        ),
        "where its files go offline": (
            ["--data.root", str(tmp_path / "empty")],
            "or copy cifar-10-python.tar.gz as downloaded, or the cifar-10-batches-py folder it "
            f"unpacks to, into {tmp_path / 'empty'}",
        ),
    }
{%- else -%}
"""Test data: a tiny {{ folder }} written in its own on-disk format (IDX files).

torchvision finds the raw files in place and skips the download, so the real
loading code runs offline.
"""

import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from torchvision import datasets

PROJECT = Path(__file__).resolve().parents[1]
SIZES = {"train": 96, "t10k": 40}


def idx_bytes(array: np.ndarray) -> bytes:
    """IDX format: zero, zero, type 0x08 (uint8), number of dims, big-endian sizes, data."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    return header + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def write_dataset(root: Path) -> list[str]:
    """Write {{ folder }}/raw/ under root; return the data arguments that select it."""
    raw = root / "{{ folder }}" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, size in SIZES.items():
        labels = (np.arange(size) % 10).astype(np.uint8)
        images = rng.integers(0, 256, (size, 28, 28), dtype=np.uint8)
        (raw / f"{split}-images-idx3-ubyte").write_bytes(idx_bytes(images))
        (raw / f"{split}-labels-idx1-ubyte").write_bytes(idx_bytes(labels))
    return ["--data.root", str(root)]


@pytest.fixture(scope="session")
def data_args(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """CLI arguments that select the tiny test dataset (written once per session)."""
    return write_dataset(tmp_path_factory.mktemp("data"))


@pytest.fixture
def train_command() -> list[str]:
    """The command that runs train.py in a subprocess."""
    return [sys.executable, str(PROJECT / "train.py")]


@pytest.fixture
def bad_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Data arguments that must be refused: name -> (arguments, part of the message)."""
    # Nothing listens on the discard port: the download fails at once, as it does offline.
    monkeypatch.setattr(datasets.{{ folder }}, "mirrors", ["http://127.0.0.1:9/"])
    (tmp_path / "empty").mkdir()
    write_dataset(tmp_path / "damaged")
    images = tmp_path / "damaged" / "{{ folder }}" / "raw" / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:1000])  # cut short, as by a copy that stopped
    return {
        "empty root, no network": (
            ["--data.root", str(tmp_path / "empty")],
            "could not be downloaded (",
        ),
        "where its files go offline": (
            ["--data.root", str(tmp_path / "empty")],
            "or copy train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
            "t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz as downloaded, or unpacked "
            f"(without .gz), into {tmp_path / 'empty' / '{{ folder }}' / 'raw'}",
        ),
        "a damaged file": (
            ["--data.root", str(tmp_path / "damaged")],
            "{{ folder }} in data.root",
        ),
    }
{%- endif %}
