"""Fixtures shared by the template's tests."""

import pytest

from helpers import RENDERS, Render, render


@pytest.fixture(scope="session", params=list(RENDERS))
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Render:
    """One render per case and combination, shared by every check that only reads it."""
    return render(tmp_path_factory.mktemp(request.param), **RENDERS[request.param])
