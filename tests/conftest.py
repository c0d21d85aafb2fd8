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


def _check_fleet_rules() -> None:
    """``KVWATCH_CHECK_FLEET_RULES=1``: every fleet-wide rule evaluation in this test run is
    compared, target by target, with the per-target evaluator (the definition); a difference
    fails the test that caused it. Lets any suite (corpus, backtest, live) serve as an
    identity test of :mod:`kvwatch.core.diagnose.fleetrules` in-process."""
    from kvwatch.core.diagnose.conditions import RuleEval
    from kvwatch.core.diagnose.fleetrules import FleetRules

    fast = FleetRules.evaluate

    def evaluate(self: FleetRules, rules):  # type: ignore[no-untyped-def]
        out = fast(self, rules)
        for rule, per_target in zip(rules, out, strict=True):
            for view, facts, o in zip(self.views, self.facts, per_target, strict=True):
                ev = RuleEval(view, rule, facts)
                result = ev.node(rule.when)
                got = (o.result, set(o.unknown), o.points, o.parts)
                want = (result, ev.unknown, ev.points, tuple(ev.parts))
                assert got == want, f"{view.key} rule {rule.id}: fleet-wide {got} != per-target {want}"
        return out

    FleetRules.evaluate = evaluate  # type: ignore[method-assign]


if __import__("os").environ.get("KVWATCH_CHECK_FLEET_RULES") == "1":
    _check_fleet_rules()
