from __future__ import annotations

import sys
from pathlib import Path

import pytest

# make `tests.support` importable as `support` from every test module
sys.path.insert(0, str(Path(__file__).parent))


@pytest.hookimpl(tryfirst=True)  # before xdist turns xdist_group marks into scopes
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n 2 --dist loadgroup`` (scripts/test): two fixed groups, one worker each.

    Tests marked ``live`` (real processes on the wall clock: they mostly wait for scrapes,
    cycles and hold-downs) run in one worker, everything else in the other, each group in
    collection order, so which tests share a process never changes from run to run; only the
    two groups overlap in time. Without xdist the marks change nothing.
    """
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        item.add_marker(pytest.mark.xdist_group("live" if item.get_closest_marker("live") else "main"))
