"""Collection's CPU shortcuts leave results and process state as they were (benchmarks/README.md, session 8)."""

from __future__ import annotations

import gc
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from kvwatch.core.collect import collect, gc_paused
from kvwatch.core.models import Target, TargetKey
from kvwatch.core.signals import Signal
from kvwatch.errors import PrometheusBadResponse

AT = datetime(2025, 3, 1, tzinfo=UTC)
TARGETS = [Target(TargetKey("j", "i"), "vllm-v1", "vllm", names=frozenset({"vllm:kv_cache_usage_perc"}))]


class _Client:
    """Answers every query with one KV usage series; records whether the cyclic GC was on."""

    url = "http://fake"

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.gc_seen = fail, []

    def _answer(self) -> list[dict[str, Any]]:
        self.gc_seen.append(gc.isenabled())
        if self.fail:
            raise PrometheusBadResponse(self.url, "HTTP 422 execution: boom")
        t = AT.timestamp()
        return [{"metric": {"job": "j", "instance": "i"}, "values": [[t - 30, "0.5"], [t, "0.75"]]}]

    def instant(self, query: str, at: datetime) -> list[dict[str, Any]]:
        return self._answer()

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[dict[str, Any]]:
        return self._answer()


def _collect(client: _Client) -> Any:
    return collect(client, TARGETS, at=AT, window_s=60, step_s=30, rate_window="2m", user_matchers="")


@pytest.fixture
def gc_restored() -> Any:
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


@pytest.mark.usefixtures("gc_restored")
@pytest.mark.parametrize("enabled", [True, False])
def test_collect_pauses_the_cyclic_gc_and_restores_it(enabled: bool) -> None:
    (gc.enable if enabled else gc.disable)()
    client = _Client()
    data = _collect(client)
    assert client.gc_seen and not any(client.gc_seen), "queries are fetched and decoded with the GC paused"
    assert gc.isenabled() is enabled
    assert data.values(TargetKey("j", "i"), next(iter(data.series[TargetKey("j", "i")]))) is not None


@pytest.mark.usefixtures("gc_restored")
def test_collect_restores_the_gc_when_a_query_fails() -> None:
    gc.enable()
    with pytest.raises(PrometheusBadResponse):
        _collect(_Client(fail=True))
    assert gc.isenabled()


@pytest.mark.usefixtures("gc_restored")
def test_nested_pauses_re_enable_only_what_they_disabled() -> None:
    gc.enable()
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled(), "the inner block found it off and leaves it off"
    assert gc.isenabled()


@pytest.mark.usefixtures("gc_restored")
@pytest.mark.parametrize("enabled", [True, False])
def test_a_service_cycle_runs_with_the_gc_paused(monkeypatch: pytest.MonkeyPatch, enabled: bool) -> None:
    """The incremental evaluator pauses the cyclic GC for the whole cycle (collection and
    diagnosis) and leaves it as it found it."""
    import kvwatch.service.incremental as incremental

    seen: list[bool] = []

    def counted(*args: Any, **kwargs: Any) -> str:
        seen.append(gc.isenabled())
        return "evaluation"

    monkeypatch.setattr(incremental, "counted", counted)
    (gc.enable if enabled else gc.disable)()
    assert incremental.IncrementalEvaluator()(None, None, None, AT) == "evaluation"  # type: ignore[arg-type]
    assert seen == [False]
    assert gc.isenabled() is enabled


def _splice_reference(old: Any, new: Any, grid: np.ndarray, modes: Any, hold_src: np.ndarray) -> Any:
    """splice as first written: one dict lookup per row and signal, rows shifted one by one."""
    from kvwatch.core.frame import FleetData

    n1, m0 = len(grid), len(grid) - len(new.grid)
    k = int(np.rint((grid[-1] - old.grid[-1]) / (grid[1] - grid[0]))) if n1 > 1 else 0
    out = FleetData(grid=grid, targets=dict(new.targets), sourced=dict(new.sourced), ceilings=dict(new.ceilings),
                    buckets=dict(new.buckets), rate_window_s=new.rate_window_s,
                    scrape_interval_s=new.scrape_interval_s)
    order: dict[tuple[Signal, str], list[tuple[TargetKey, Any, Any]]] = {}
    for key in new.targets:
        olds, news = old.series.get(key, {}), new.series.get(key, {})
        sigs = olds.keys() | news.keys()
        if sigs:
            out.series[key] = {}
        for sig in sigs:
            order.setdefault((sig, modes.get((key, sig), "range")), []).append((key, olds.get(sig), news.get(sig)))
    for (sig, mode), rows in order.items():
        for key, prev, fresh in rows:
            if mode == "static":
                if fresh is not None:
                    out.series[key][sig] = np.full(n1, fresh[-1])
                continue
            row = np.full(n1, np.nan)
            if prev is not None and m0 > 0:
                row[:m0] = prev[k : k + m0]
            if fresh is not None:
                row[m0:] = fresh
            if mode == "coarse":
                row[hold_src < 0] = np.nan
            out.series[key][sig] = row
    for key in [key for key, sigs in out.series.items() if not sigs]:
        del out.series[key]
    return out


@pytest.mark.parametrize("seed", range(40))
def test_splice_equals_the_row_by_row_reference(seed: int) -> None:
    """Random windows: targets with and without rows on either side, signals only old or only
    new, static / coarse / range / unknown modes, NaN and ±inf values, shifts of 1-4 steps."""
    from kvwatch.core.frame import FleetData
    from kvwatch.service.incremental import splice

    rng = np.random.default_rng(seed)
    n, step = int(rng.integers(5, 12)), 30.0
    shift = int(rng.integers(1, 5))
    fetched = shift + int(rng.integers(0, 3))  # the new steps plus an overlap: old covers the rest
    grid_old = 1_700_000_000.0 + step * np.arange(n)
    grid = grid_old + shift * step
    keys = [TargetKey(f"j{i % 3}", f"10.0.0.{i}:8000") for i in range(int(rng.integers(0, 25)))]
    targets = {k: Target(k, "vllm-v1", "vllm") for k in keys}
    sigs = list(Signal)[: int(rng.integers(1, 8))]

    def rows(length: int) -> dict[TargetKey, dict[Signal, np.ndarray]]:
        out: dict[TargetKey, dict[Signal, np.ndarray]] = {}
        for k in keys:
            if rng.random() < 0.15:
                continue  # no rows at all for this target
            chosen = [s for s in sigs if rng.random() < 0.7]
            vals = rng.choice([0.0, 1.5, -2.0, np.nan, np.inf, -np.inf, 0.25], size=(len(chosen), length))
            out[k] = {s: v for s, v in zip(chosen, vals, strict=True)}
        return out

    old = FleetData(grid=grid_old, targets=dict(targets), series=rows(n))
    new = FleetData(grid=grid[-fetched:], targets=dict(targets), series=rows(fetched), rate_window_s=120.0,
                    scrape_interval_s=15.0)
    modes = {(k, s): str(rng.choice(["range", "static", "coarse"])) for k in keys for s in sigs if rng.random() < 0.9}
    hold_src = np.where(np.arange(n) < int(rng.integers(0, 3)), -1, np.arange(n))
    got, want = splice(old, new, grid, modes, hold_src), _splice_reference(old, new, grid, modes, hold_src)
    assert list(got.series) == list(want.series)
    for k, sigs_want in want.series.items():
        assert list(got.series[k]) == list(sigs_want), "signals keep their order"
        for s, v in sigs_want.items():
            assert got.series[k][s].tobytes() == v.tobytes() and got.series[k][s].shape == v.shape
    assert (got.targets, got.ceilings, got.buckets, got.rate_window_s, got.scrape_interval_s) == (
        want.targets, want.ceilings, want.buckets, want.rate_window_s, want.scrape_interval_s)
