"""Fixtures and hooks shared by the template's tests."""

import os
from collections.abc import Iterator

import pytest

from helpers import RENDERS, Render, render

# The template's tests run several projects' processes at once (two suites beside the other
# tests): torch's intra-op threads, one per core in each process, then outnumber the cores and
# wait on each other. One thread each keeps every process busy; the commands are the same.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def waits_for_a_suite(item: pytest.Item) -> bool:
    return item.name.startswith("test_generated_suite_passes[")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that wait for the generated projects' suites run last."""
    items.sort(key=waits_for_a_suite)  # stable: the others keep their order


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Iterator[object]:
    """The suites of the selected tests start before the first test, in the background (most of
    the run's time: the template's other tests run meanwhile), and stop with the session."""
    waiting = [item for item in session.items if waits_for_a_suite(item)]
    start = waiting and not session.testsfailed and not session.config.option.collectonly
    if start:
        module = waiting[0].module
        module.start_suites([item.callspec.params["name"] for item in waiting])
    try:
        return (yield)
    finally:
        if start:
            module.stop_suites()


@pytest.fixture(scope="session", params=list(RENDERS))
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Render:
    """One render per case and combination, shared by every check that only reads it."""
    return render(tmp_path_factory.mktemp(request.param), **RENDERS[request.param])
