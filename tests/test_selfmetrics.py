"""Self-metrics are served from a snapshot of the last evaluation: a scrape never sees a partial set."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_lifecycle import diag, result

from kvwatch.core.models import Evaluation, FailureMode, Target, TargetKey
from kvwatch.service.selfmetrics import SelfMetrics


def _evaluation(prefix: str, n: int, mode: FailureMode) -> Evaluation:
    results = tuple(
        result(diag(mode), target=Target(TargetKey("job", f"{prefix}-{i}:8000"), "vllm-v1", "vllm", "m"))
        for i in range(n)
    )
    return Evaluation(evaluated_at=datetime.now(tz=UTC), results=results, window_s=600.0, queries=0)


def _scrape(m: SelfMetrics) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(generate_latest(m.registry).decode()):
        out[fam.name] = fam.samples
    return out


def test_vanished_targets_disappear_and_counts_match() -> None:
    m = SelfMetrics()
    m.observe_evaluation(_evaluation("a", 3, FailureMode.FULL))
    m.observe_evaluation(_evaluation("b", 2, FailureMode.OSCILLATING))
    got = _scrape(m)
    ones = [s for s in got["kvwatch_target_state"] if s.value == 1]
    assert sorted(s.labels["instance"] for s in ones) == ["b-0:8000", "b-1:8000"]
    assert {s.labels["state"] for s in ones} == {"oscillating"}
    by_state = {s.labels["state"]: s.value for s in got["kvwatch_targets"]}
    assert by_state["oscillating"] == 2 and by_state["full"] == 0 and len(by_state) == len(FailureMode)
    assert len(got["kvwatch_diagnosis_active"]) == 2
    assert {s.labels["mode"] for s in got["kvwatch_incidents_open"]} >= {"full", "oscillating"}


def test_a_scrape_never_sees_a_partial_evaluation() -> None:
    """Scrapes racing evaluations of two different fleets always see exactly one of the two."""
    m = SelfMetrics()
    a, b = _evaluation("a", 200, FailureMode.FULL), _evaluation("b", 300, FailureMode.IDLE)
    want = {frozenset(f"{p}-{i}:8000" for i in range(n)) for p, n in (("a", 200), ("b", 300))}
    m.observe_evaluation(a)
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            for ev in (b, a):
                m.observe_evaluation(ev)

    t = threading.Thread(target=flip)
    t.start()
    try:
        seen = set()
        for _ in range(15):
            got = _scrape(m)
            instances = frozenset(s.labels["instance"] for s in got["kvwatch_target_state"])
            assert instances in want, f"partial set of {len(instances)} targets"
            total = sum(s.value for s in got["kvwatch_targets"])
            assert total == len(instances), "targets by state disagree with the per-target series"
            seen.add(instances)
    finally:
        stop.set()
        t.join()
    assert len(seen) == 2, "the race never flipped: the test proved nothing"
