"""Collection's CPU shortcuts leave results and process state as they were (benchmarks/README.md, session 8)."""

from __future__ import annotations

import gc
import threading
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from kvwatch.core.collect import collect, gc_paused
from kvwatch.core.frame import FleetData
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


class _GatedClient(_Client):
    """Answers the first query at once and every later one only after something was placed
    (or after ``patience_s``): a later query blocks until collection uses an answer it has."""

    def __init__(self, placed: threading.Event, patience_s: float = 5.0) -> None:
        super().__init__()
        self.placed, self.patience_s, self.waited = placed, patience_s, []

    def _answer(self) -> list[dict[str, Any]]:
        if self.gc_seen:  # not the first query
            self.waited.append(self.placed.wait(self.patience_s))
        return super()._answer()


def test_answers_are_placed_while_later_queries_are_still_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A steady 1,000-target cycle waits ~0.5 s on Prometheus and spends ~0.1 s placing what it
    fetched: placed as each answer comes in (in the planned order), the placing overlaps the
    wait (benchmarks/README.md, session 38). With one worker the queries run one by one; the
    second is answered only once the first answer was placed."""
    placed = threading.Event()
    put = FleetData.put

    def put_and_tell(self: FleetData, *args: Any, **kwargs: Any) -> None:
        placed.set()
        put(self, *args, **kwargs)

    monkeypatch.setattr(FleetData, "put", put_and_tell)
    client = _GatedClient(placed)
    names = frozenset({"vllm:kv_cache_usage_perc", "vllm:num_requests_waiting", "vllm:num_requests_running"})
    target = Target(TargetKey("j", "i"), "vllm-v1", "vllm", names=names)
    data = collect(client, [target], at=AT, window_s=60, step_s=30, rate_window="2m", user_matchers="",
                   max_concurrency=1)
    assert client.waited and all(client.waited), "a later query waited for placing that never overlapped it"
    assert len(client.waited) >= 2
    assert data.series[target.key][Signal.KV_USAGE].tolist()[-1] == 0.75


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


def _plan_reference(targets: list[Target], user: str, rw: str, lw: str | None, tm: str,
                    signals: set[Signal] | None) -> dict[str, list[tuple[Signal, set[TargetKey], Any]]]:
    """plan() target by target, as it was before it grouped targets by dialect and names."""
    from collections import defaultdict

    from kvwatch.core.collect import resolve

    uses: dict[tuple[Signal, Any], set[TargetKey]] = defaultdict(set)
    for t in targets:
        for sig, src in resolve(t).items():
            if signals is None or sig in signals:
                uses[(sig, src)].add(t.key)
    queries: dict[str, list[tuple[Signal, set[TargetKey], Any]]] = defaultdict(list)
    for (sig, src), keys in uses.items():
        queries[src.promql(user, rw, lw, tm)].append((sig, keys, src))
    return dict(queries)


@pytest.mark.parametrize("seed", range(30))
def test_plan_equals_the_target_by_target_reference(seed: int) -> None:
    """plan() resolves each (dialect, metric names) once: the same queries, in the same order, with
    the same (signal, targets, source) uses in the same order as resolving target by target, for
    fleets mixing dialects, targets of one dialect exporting different names (fallback sources),
    equal names under other dialects, models, gone targets and signal filters."""
    import random

    from kvwatch.core.collect import plan
    from kvwatch.core.dialects import DIALECT_BY_ID

    rng = random.Random(seed)
    dialects = sorted(DIALECT_BY_ID)
    pools = {d: sorted({n for srcs in DIALECT_BY_ID[d].sources.values() for s in srcs for n in s.requires})
             for d in dialects}
    namesets = []
    for _ in range(rng.randint(1, 8)):
        d = rng.choice(dialects)
        names = frozenset(n for n in pools[d] if rng.random() < 0.8)
        namesets.append((d, names))
        if rng.random() < 0.3:  # the same names read by another dialect
            namesets.append((rng.choice(dialects), names))
    targets = []
    for i in range(rng.randint(0, 60)):
        d, names = rng.choice(namesets)
        targets.append(Target(TargetKey(rng.choice(("a", "b", "")), f"10.0.0.{i}:8000"), d, "e",
                              model=rng.choice(("", "m1", "m2")), names=names, gone=rng.random() < 0.1))
    rng.shuffle(targets)
    signals = None if rng.random() < 0.5 else set(rng.sample(list(Signal), rng.randint(0, len(Signal))))
    user = rng.choice(("", 'namespace="llm"'))
    lw = rng.choice((None, "10m"))
    tm = rng.choice(("", "ensemble.*"))
    want = _plan_reference(targets, user, "2m", lw, tm, signals)
    got = plan(targets, user, "2m", lw, tm, signals)
    assert list(got) == list(want)
    for q in want:
        assert [(sig, sorted(keys, key=str), src) for sig, keys, src in got[q]] == [
            (sig, sorted(keys, key=str), src) for sig, keys, src in want[q]], q
        assert [keys for _, keys, _ in got[q]] == [keys for _, keys, _ in want[q]]


def test_target_key_hashes_and_compares_in_c() -> None:
    """TargetKey keys most dicts and sets of a cycle (~140,000 hashes per steady 1,000-target
    cycle): a tuple's C-level hash and equality, not a dataclass' Python-level ones; the same
    hash as the dataclass had (set orders unchanged), fields, immutability, repr and str."""
    k = TargetKey("vllm", "10.0.0.1:8000")
    assert TargetKey.__hash__ is tuple.__hash__ and TargetKey.__eq__ is tuple.__eq__
    assert hash(k) == hash(("vllm", "10.0.0.1:8000"))
    assert k == TargetKey(job="vllm", instance="10.0.0.1:8000") and k != TargetKey("vllm", "10.0.0.2:8000")
    assert (k.job, k.instance) == ("vllm", "10.0.0.1:8000")
    assert repr(k) == "TargetKey(job='vllm', instance='10.0.0.1:8000')"
    assert str(k) == "vllm/10.0.0.1:8000" and str(TargetKey("", "i:1")) == "i:1"
    with pytest.raises(AttributeError):
        k.job = "other"  # type: ignore[misc]
