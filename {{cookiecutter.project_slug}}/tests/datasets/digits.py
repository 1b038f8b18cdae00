"""Test data: the digits ship with scikit-learn, so there is nothing to write."""

import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_args() -> list[str]:
    """CLI arguments that select the test dataset: the defaults already do."""
    return []


@pytest.fixture
def train_command() -> list[str]:
    """The command that runs train.py in a subprocess."""
    return [sys.executable, str(PROJECT / "train.py")]


@pytest.fixture
def bad_data() -> dict:
    """Data arguments that must be refused: name -> (arguments, part of the message)."""
    return {"test fraction above 1": (["--data.test_fraction", "1.5"], "data.test_fraction")}
