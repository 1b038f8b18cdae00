"""Fixtures and hooks shared by the template's tests."""

import os

import pytest

from helpers import RENDERS, Render, render

# The template's tests run several projects' processes at once (two suites beside the other
# tests): torch's intra-op threads, one per core in each process, then outnumber the cores and
# wait on each other. One thread each keeps every process busy; the commands are the same.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The generated projects' suites (most of the run) start now, in the background, and the
    tests that wait for them run last: the template's other tests run meanwhile."""
    waiting = [item for item in items if item.name.startswith("test_generated_suite_passes[")]
    if waiting and not config.option.collectonly:
        items[:] = [item for item in items if item not in waiting] + waiting
        waiting[0].module.start_suites()


@pytest.fixture(scope="session", params=list(RENDERS))
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Render:
    """One render per case and combination, shared by every check that only reads it."""
    return render(tmp_path_factory.mktemp(request.param), **RENDERS[request.param])
