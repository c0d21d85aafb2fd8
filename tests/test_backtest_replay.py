"""The pure replay on in-memory history: window views, steps, lifecycle and chunked fetching."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pytest

from kvwatch.config import LifecycleSettings
from kvwatch.core.collect import plan
from kvwatch.core.diagnose import Params, diagnose
from kvwatch.core.frame import FleetData
from kvwatch.core.models import FailureMode, Target, TargetKey
from kvwatch.core.rules import load_ruleset
from kvwatch.core.signals import Signal
from kvwatch.errors import ConfigError
from kvwatch.tools.backtest.history import HistorySpec, fetch_history
from kvwatch.tools.backtest.replay import ReplayParams, check_step, replay, step_times
from kvwatch.tools.backtest.window import WindowData

RES, WINDOW = 30.0, 1800.0
G0 = 1_000_000.0
GRID = G0 + RES * np.arange(int(3 * 3600 / RES) + 1)  # 3 h of history
RULES = load_ruleset()
FULL = (G0 + 3600, G0 + 5400)  # pod-0 is full for 30 min


def _signals(full: bool, n: int) -> dict[Signal, np.ndarray]:
    rng = np.random.default_rng(3)
    inside = (FULL[0] <= GRID) & (FULL[1] > GRID) if full else np.zeros(n, bool)
    return {
        Signal.KV_USAGE: np.where(inside, 0.97, 0.70) + rng.normal(0, 0.01, n),
        Signal.RUNNING: np.full(n, 30.0),
        Signal.WAITING: np.where(inside, 6.0, 0.0),
        Signal.PREEMPTIONS: np.where(inside, 0.5, 0.0),
        Signal.GEN_TPS: np.full(n, 1000.0),
        Signal.PROMPT_TPS: np.full(n, 4000.0),
        Signal.REQUEST_RATE: np.full(n, 4.0),
        Signal.KV_CAPACITY_TOKENS: np.full(n, 200_000.0),
        # a healthy tail: without TTFT the misread mode is undecidable, so never `healthy`
        Signal.TTFT_P50: np.full(n, 0.2),
        Signal.TTFT_P99: np.full(n, 0.8),
        Signal.TTFT_MEAN: np.full(n, 0.3),
    }


def _history(late_start: float | None = None) -> tuple[list[Target], FleetData]:
    targets = [Target(TargetKey("vllm", f"pod-{i}"), "vllm-v1", "vllm", "m") for i in range(2)]
    data = FleetData(grid=GRID, targets={t.key: t for t in targets})
    for i, t in enumerate(targets):
        sigs = _signals(i == 0, len(GRID))
        if i == 1 and late_start is not None:
            for v in sigs.values():
                v[late_start > GRID] = np.nan
        data.sourced[t.key] = set(sigs)
        for s, v in sigs.items():
            data.put(t.key, s, v)
    return targets, data


def _copy_window(data: FleetData, t: float) -> FleetData:
    """What collect would have returned for an evaluation at t: an independent copy of [t − W, t]."""
    keep = (data.grid >= t - WINDOW) & (data.grid <= t)
    out = FleetData(grid=data.grid[keep].copy(), targets=data.targets, sourced=data.sourced)
    for key, sigs in data.series.items():
        for s, v in sigs.items():
            out.put(key, s, v[keep].copy())
    return out


PARAMS = ReplayParams(WINDOW, RES, 2.0, LifecycleSettings(hold_down=300, pending_for=120))


def test_window_view_equals_a_fresh_collection() -> None:
    targets, data = _history()
    for t in (G0 + WINDOW, FULL[0] + 690, FULL[1] + 60, float(GRID[-1])):
        p = Params(at=t, window_s=WINDOW, step_s=RES)
        view, copy = WindowData(data, t, WINDOW), _copy_window(data, t)
        assert np.array_equal(view.grid, copy.grid) and view.grid[-1] == t and len(view.grid) == 61
        got, want = diagnose(targets, view, RULES, p), diagnose(targets, copy, RULES, p)
        assert [(r.target.key, r.state, r.facts) for r in got] == [(r.target.key, r.state, r.facts) for r in want]


def test_replay_states_and_incident_timing() -> None:
    targets, data = _history()
    steps = step_times(G0 + WINDOW, float(GRID[-1]), 60.0)
    [sick, well] = replay(targets, data, RULES, PARAMS, steps)
    assert sick.times == steps and set(well.states) == {FailureMode.HEALTHY}
    for t, state in zip(sick.times, sick.states, strict=True):
        want = diagnose(targets, _copy_window(data, t), RULES, Params(at=t, window_s=WINDOW, step_s=RES))
        assert state is next(r.state for r in want if r.target.key == sick.target.key)
    full = [t for t, s in zip(sick.times, sick.states, strict=True) if s is FailureMode.FULL]
    [inc] = [i for i in sick.incidents if i.mode is FailureMode.FULL]
    assert inc.pending_at == full[0]
    # the rule's `for` is enforced inside diagnose; the lifecycle adds pending_for only
    assert inc.opened_at == full[0] + PARAMS.lifecycle.pending_for
    assert inc.resolved_at == pytest.approx(full[-1] + 300, abs=60)  # hold-down from the last match
    assert inc.resolution == "cleared"


def test_late_target_joins_at_its_first_sample() -> None:
    late = G0 + 7200
    targets, data = _history(late_start=late)
    steps = step_times(G0 + WINDOW, float(GRID[-1]), 300.0)
    tls = {tl.target.key.instance: tl for tl in replay(targets, data, RULES, PARAMS, steps)}
    assert tls["pod-1"].times[0] == late and tls["pod-0"].times == steps


def test_step_grid_and_validation() -> None:
    assert step_times(130.0, 400.0, 60.0) == (160.0, 220.0, 280.0, 340.0, 400.0)  # anchored at the end
    assert step_times(100.0, 100.0, 30.0) == (100.0,)
    check_step(60.0, 30.0)
    for bad in (45.0, 15.0, 0.0):
        with pytest.raises(ConfigError, match=r"multiple of the data resolution .*--resolution or evaluation\.step"):
            check_step(bad, 30.0)


class _FakeProm:
    """Answers range queries with value = timestamp on the exact step grid; counts queries."""

    url = "http://fake"

    def __init__(self, targets: list[Target]) -> None:
        self.targets = targets
        self.ranges: list[tuple[float, float]] = []

    def instant(self, query: str, at: datetime) -> list[dict]:
        raise AssertionError("fetch_history must not send instant queries")

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[dict]:
        self.ranges.append((start.timestamp(), end.timestamp()))
        if "@ end()" in query:  # the relabel-leftover probe (kvwatch/core/churn.py): no leftovers here
            return []
        ts = np.arange(start.timestamp(), end.timestamp() + step_s / 2, step_s)
        return [
            {"metric": {"job": t.key.job, "instance": t.key.instance}, "values": [[x, str(x)] for x in ts]}
            for t in self.targets
        ]


def test_long_spans_are_fetched_in_contiguous_chunks() -> None:
    names = frozenset({"vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"})
    targets = [Target(TargetKey("vllm", "a"), "vllm-v1", "vllm", "m", names)]
    spec = HistorySpec(start=G0 + 3000, end=G0 + 6000, window_s=600, resolution_s=RES, rate_window="2m",
                       user_matchers="", max_points=40)
    client = _FakeProm(targets)
    data = fetch_history(client, targets, spec)
    n_queries = len(plan(targets, "", "2m"))
    expected_grid = G0 + 6000 - RES * np.arange(int(3600 / RES), -1, -1)
    assert np.array_equal(data.grid, expected_grid)
    chunks = -(-len(expected_grid) // 40)
    assert len(client.ranges) == chunks * (n_queries + 1)  # + the relabel-leftover probe per chunk
    for sig in (Signal.KV_USAGE, Signal.RUNNING, Signal.WAITING):
        assert np.array_equal(data.values(targets[0].key, sig), expected_grid)  # no gaps, no overlaps


def test_static_signals_are_fetched_over_the_span_not_at_its_end() -> None:
    """A configured cap that changes inside the replayed span (max_num_seqs cut, then restored)
    must be seen at each step as it was then: an instant value at T1 held over the whole history
    leaks the future into earlier steps (running / cap then reads 4 / 1024 while running sits
    at its new cap of 4, and the batch-limited rule cannot match)."""
    names = frozenset({"trtllm_kv_cache_utilization", "trtllm_num_requests_running", "trtllm_num_requests_waiting",
                       "trtllm_max_num_active_requests", "trtllm_kv_cache_max_blocks"})
    targets = [Target(TargetKey("trt", "a"), "trtllm-serve", "trtllm", "m", names)]
    spec = HistorySpec(start=G0 + 3000, end=G0 + 6000, window_s=600, resolution_s=RES, rate_window="2m",
                       user_matchers="")
    data = fetch_history(_FakeProm(targets), targets, spec)
    assert np.array_equal(data.values(targets[0].key, Signal.MAX_RUNNING), data.grid)  # value = its own time


def test_an_incident_that_changes_mode_keeps_every_mode_it_carried() -> None:
    """One incident per engine episode: a fragmented stall whose backlog then drains through a
    truly full pool becomes `full` in place. The record must keep the mode it opened with and
    when each later mode took over, or a benchmark reads `full` from the start."""
    targets, data = _history()
    key = targets[0].key
    inside = (FULL[0] <= GRID) & (FULL[1] > GRID)
    stall = (FULL[0] - 1800 <= GRID) & (FULL[0] > GRID)  # 30 min before the pool fills: free KV, a queue
    data.put(key, Signal.KV_USAGE, np.where(inside, 0.97, np.where(stall, 0.35, 0.70)))
    data.put(key, Signal.WAITING, np.where(inside | stall, 6.0, 0.0))
    # reservations admit a varying number of requests: running is not pinned at a ceiling
    data.put(key, Signal.RUNNING, np.random.default_rng(5).integers(15, 45, len(GRID)).astype(float))
    steps = step_times(G0 + WINDOW, float(GRID[-1]), 60.0)
    [sick, _] = replay(targets, data, RULES, PARAMS, steps)
    [inc] = sick.incidents
    first_frag = next(t for t, s in zip(sick.times, sick.states, strict=True) if s is FailureMode.FRAGMENTED)
    first_full = next(t for t, s in zip(sick.times, sick.states, strict=True) if s is FailureMode.FULL)
    assert inc.mode is FailureMode.FULL  # the primary mode now (the most severe)
    assert [(c.mode, c.at) for c in inc.modes] == [(FailureMode.FRAGMENTED, inc.opened_at),
                                                  (FailureMode.FULL, first_full)]
    assert inc.opened_at == first_frag + PARAMS.lifecycle.pending_for
    assert inc.to_json()["modes"][0]["mode"] == "fragmented"


def test_a_replayed_step_reads_the_rate_windows_the_history_was_fetched_with() -> None:
    """Facts subtract the rate window a counter was read with (a preemption rate reads an event
    a rate window late: preemption_reach_s; an estimated queue outlasts the queue: queue_reach_s).
    A replayed step must carry the fleet's and each slow target's window, as `once` records them;
    it read 0 s ("not recorded"), so the backtest held a settled tail back 2 minutes longer."""
    from kvwatch.tools.backtest.window import StepView

    slow, fast = Target(TargetKey("j", "slow"), "vllm-v1", "vllm", "m"), Target(TargetKey("j", "fast"), "vllm-v1", "vllm", "m")
    grid = 1_000_000.0 + 30.0 * np.arange(80)
    layer = FleetData(grid=grid, targets={slow.key: slow, fast.key: fast}, rate_window_s=120.0,
                      target_rate_window_s={slow.key: 240.0})
    for t in (slow, fast):
        layer.sourced[t.key] = {Signal.KV_USAGE}
        layer.put(t.key, Signal.KV_USAGE, np.full(len(grid), 0.5))
    view = StepView([layer], {slow.key: 0, fast.key: 0}, [slow, fast], float(grid[-1]), 1800.0)
    assert (view.rate_window(fast.key), view.rate_window(slow.key)) == (120.0, 240.0)
    window = WindowData(layer, float(grid[-1]), 1800.0)
    assert (window.rate_window(fast.key), window.rate_window(slow.key)) == (120.0, 240.0)
