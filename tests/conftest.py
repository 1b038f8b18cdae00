"""Fixtures shared by the template's tests."""

import pytest

from helpers import CASES, Render, render


@pytest.fixture(scope="session", params=list(CASES))
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Render:
    """One render per case, shared by every check that only reads it."""
    return render(tmp_path_factory.mktemp(request.param), **CASES[request.param])
