"""Rate windows sized from the scrape interval (issue 11, item 9), against a real Prometheus.

One healthy vLLM engine per scrape interval (15, 30, 60 s, with ±2 s scrape jitter as
real scrapes have). With 60 s scrapes a fixed 2-minute ``rate()`` window often holds one
sample and counter signals go missing; kvwatch measures the interval and widens the window
to 4 intervals (Grafana's ``$__rate_interval``), so no counter signal has gaps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from fixtures.core import fleet
from support.prom import backfill, prometheus

from kvwatch.config import load_settings
from kvwatch.core.collect import collect
from kvwatch.core.discover import discover
from kvwatch.core.explain import explain_text
from kvwatch.core.models import FailureMode, TargetKey
from kvwatch.core.pipeline import collect_targets, evaluate, find_targets
from kvwatch.core.promclient import PromClient
from kvwatch.core.rules import load_ruleset
from kvwatch.core.scrape import detect_interval, slower_than_fleet
from kvwatch.core.signals import Signal
from kvwatch.service.incremental import IncrementalEvaluator
from kvwatch.tools.backtest.replay import run_backtest

pytestmark = [pytest.mark.prometheus]

INTERVALS = (15.0, 30.0, 60.0)
COUNTERS = (Signal.GEN_TPS, Signal.PROMPT_TPS, Signal.REQUEST_RATE, Signal.PREEMPTIONS)
SPAN = 3000.0


def _member(w: fleet._Writer, interval: float, end: float, instance: str | None = None) -> None:
    t0 = end - SPAN
    n = int(SPAN // interval)
    # scrape k lands within ±2 s of its slot (deterministic jitter); the last one exactly at end
    times = [t0 + k * interval + (2.0 * math.sin(1.7 * k) if k < n else 0.0) for k in range(n + 1)]
    fleet.write_engine(w, "vllm-0.33", {"job": "vllm", "instance": instance or f"i{interval:g}:8000", "engine": "0"}, times, t0,
                       "healthy")


@dataclass(frozen=True)
class Store:
    url: str
    at: datetime


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    end = math.floor((time.time() - 4 * 3600) / 600) * 600
    w = fleet._Writer()
    for interval in INTERVALS:
        _member(w, interval, end)
    work = tmp_path_factory.mktemp("rate-windows")
    backfill(w.text(), work / "data")
    with prometheus(tsdb=work / "data") as url:
        yield Store(url, datetime.fromtimestamp(end, tz=UTC))


def _sel(interval: float) -> str:
    return f'instance="i{interval:g}:8000"'


def _gaps(store: Store, interval: float, rate_window: str) -> dict[Signal, float]:
    """Fraction of the 30-minute grid without a value, per counter signal, at that rate window."""
    client = PromClient(store.url)
    targets = discover(client, store.at, 1800.0, _sel(interval))
    data = collect(client, targets, at=store.at, window_s=1800.0, step_s=30.0, rate_window=rate_window,
                   user_matchers=_sel(interval))
    (t,) = targets
    return {s: float(np.mean(~np.isfinite(data.values(t.key, s)))) for s in COUNTERS}


@pytest.mark.parametrize("interval", INTERVALS)
def test_scrape_interval_is_detected_from_the_data(store: Store, interval: float) -> None:
    client = PromClient(store.url)
    targets = discover(client, store.at, 1800.0, _sel(interval))
    got = detect_interval(client, store.at, targets, _sel(interval))
    assert got is not None and got == pytest.approx(interval, rel=0.15)


def test_fixed_two_minute_window_loses_counters_at_60s(store: Store) -> None:
    """The defect, reproduced: 60 s scrapes, rate(...[2m]) → gaps in every counter signal."""
    gaps = _gaps(store, 60.0, "2m")
    assert all(g > 0.05 for g in gaps.values()), gaps


@pytest.mark.parametrize("interval", INTERVALS)
def test_rate_window_widens_with_the_scrape_interval(store: Store, interval: float) -> None:
    settings = load_settings(None, environ={}, overrides={"discovery": {"selector": "{" + _sel(interval) + "}"}})
    ev = evaluate(PromClient(store.url), settings, load_ruleset(), store.at)
    want = max(120.0, 4 * interval)
    assert ev.rate_window_s == pytest.approx(want, rel=0.15), (ev.rate_window_s, ev.scrape_interval_s)
    assert ev.to_json()["rate_window_seconds"] == ev.rate_window_s
    (r,) = ev.results
    assert not [m for m in r.missing_signals if "(no data)" in m and m.split()[0] in {s.value for s in COUNTERS}]
    assert r.state is FailureMode.HEALTHY, (r.state, r.primary and r.primary.summary)
    rw = f"{int(ev.rate_window_s)}s"
    assert all(g == 0.0 for g in _gaps(store, interval, rw).values()), (rw, _gaps(store, interval, rw))


#: a fleet scraped mostly every 15 s with one slow job (60 s): the fleet's window is sized
#: for the 15 s majority (the slow target is under the 90th percentile of intervals)
FAST_MEMBERS = 11


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    end = math.floor((time.time() - 4 * 3600) / 600) * 600
    w = fleet._Writer()
    for i in range(FAST_MEMBERS):
        _member(w, 15.0, end, f"fast{i}:8000")
    _member(w, 60.0, end, "slow:8000")
    work = tmp_path_factory.mktemp("rate-windows-mixed")
    backfill(w.text(), work / "data")
    with prometheus(tsdb=work / "data") as url:
        yield Store(url, datetime.fromtimestamp(end, tz=UTC))


def test_a_slow_minority_gets_its_own_rate_window(mixed: Store) -> None:
    """One target scraped every 60 s among 15 s ones: the fleet window (2 m, right for the
    majority) would leave its counters with gaps; it is re-read with a window of 4 of its
    own intervals, and the majority keeps its 2 m window."""
    settings = load_settings(None, environ={}, overrides={})
    client = PromClient(mixed.url)
    targets = find_targets(client, settings, mixed.at)
    data = collect_targets(client, settings, load_ruleset(), targets, mixed.at)
    assert data.rate_window_s == pytest.approx(120.0)
    by_name = {t.key.instance: t.key for t in targets}
    slow = by_name["slow:8000"]
    gaps = {s: float(np.mean(~np.isfinite(data.values(slow, s)))) for s in COUNTERS}
    assert all(g == 0.0 for g in gaps.values()), gaps
    assert data.target_rate_window_s == {slow: pytest.approx(240.0, rel=0.15)}
    for i in range(FAST_MEMBERS):
        fast = by_name[f"fast{i}:8000"]
        assert all(np.all(np.isfinite(data.values(fast, s))) for s in COUNTERS)
    ev = evaluate(client, settings, load_ruleset(), mixed.at)
    states = {r.target.key.instance: r.state for r in ev.results}
    assert set(states.values()) == {FailureMode.HEALTHY}, states
    # the JSON and `kvwatch explain` say which window the slow target was read with
    assert ev.to_json()["rate_window_seconds_by_target"] == {f"{slow.job}/{slow.instance}": 240.0}
    assert ev.target_rate_windows == {slow: 240.0} and ev.rate_window_s == 120.0  # the others keep the fleet's
    (r,) = [r for r in ev.results if r.target.key == slow]
    head = explain_text(r, ev).splitlines()[0]
    assert "rate window 4m, scraped slower than the fleet (2m)" in head, head


def test_the_service_keeps_the_slow_targets_window_across_incremental_cycles(mixed: Store) -> None:
    """The incremental service re-reads the slow target's new steps with its own window too:
    its spliced rows equal a full fetch's at the same instant."""
    settings = load_settings(None, environ={}, overrides={})
    rules = load_ruleset()
    client = PromClient(mixed.url)
    inc = IncrementalEvaluator()
    for back in (300, 120, 0):
        inc(client, settings, rules, mixed.at - timedelta(seconds=back))
    assert inc.last_mode == "incremental" and inc.data is not None
    full = collect_targets(client, settings, rules, find_targets(client, settings, mixed.at), mixed.at,
                           signals=rules.decision_signals())
    slow = next(k for k in full.targets if k.instance == "slow:8000")
    assert inc.data.target_rate_window_s == full.target_rate_window_s == {slow: 240.0}
    for sig in COUNTERS:
        if sig in full.series[slow]:
            np.testing.assert_array_equal(inc.data.values(slow, sig), full.values(slow, sig), err_msg=sig.value)
            assert np.all(np.isfinite(inc.data.values(slow, sig))), sig


def test_which_targets_are_slower_than_the_fleet() -> None:
    """Own window = 4 own intervals, rounded up to whole minutes after 5 % jitter slack; only
    windows over 1.25 × the fleet's are read apart; no fleet interval, no classes."""
    own = {TargetKey("a", "15"): 15.0, TargetKey("a", "37"): 37.0, TargetKey("a", "60"): 60.0,
           TargetKey("a", "61.5"): 61.5, TargetKey("a", "120"): 120.0}
    assert slower_than_fleet(120.0, 15.0, own) == {
        TargetKey("a", "60"): 240.0, TargetKey("a", "61.5"): 240.0, TargetKey("a", "120"): 480.0}
    assert slower_than_fleet(120.0, 60.0, own) == {TargetKey("a", "120"): 480.0}
    assert slower_than_fleet(120.0, None, own) == {}
    assert slower_than_fleet(600.0, 15.0, own) == {}  # a wide configured window covers them all


def test_the_backtest_sizes_windows_from_the_scrape_interval_too(mixed: Store) -> None:
    """``kvwatch backtest`` over the mixed fleet: the slow target's counters hold no gaps over
    the replayed span, as in ``once``, and every target is replayed healthy."""
    settings = load_settings(None, environ={}, overrides={})
    result = run_backtest(PromClient(mixed.url), settings, load_ruleset(), mixed.at - timedelta(minutes=20), mixed.at)
    assert result.history is not None
    slow = next(k for k in result.history.targets if k.instance == "slow:8000")
    span = result.history.grid >= (mixed.at - timedelta(minutes=20)).timestamp()
    gaps = {s: float(np.mean(~np.isfinite(result.history.values(slow, s)[span]))) for s in COUNTERS}
    assert all(g == 0.0 for g in gaps.values()), gaps
    assert {s for tl in result.timelines for s in tl.states} == {FailureMode.HEALTHY}


def test_a_target_whose_own_window_changed_is_fetched_whole(mixed: Store) -> None:
    """The kept rows of a target were read with another window (its scrape interval changed
    between discoveries; here: kept as if read through the fleet's 2 m window, with gaps):
    the next incremental cycle fetches that target whole instead of splicing onto them."""
    settings = load_settings(None, environ={}, overrides={})
    rules = load_ruleset()
    client = PromClient(mixed.url)
    inc = IncrementalEvaluator()
    inc(client, settings, rules, mixed.at - timedelta(seconds=120))
    assert inc.data is not None
    slow = next(k for k in inc.data.targets if k.instance == "slow:8000")
    inc.data.target_rate_window_s.clear()
    for sig in COUNTERS:
        if sig in inc.data.series[slow]:
            inc.data.series[slow][sig] = np.full(len(inc.data.grid), np.nan)
    inc(client, settings, rules, mixed.at)
    assert inc.last_mode == "incremental"
    full = collect_targets(client, settings, rules, find_targets(client, settings, mixed.at), mixed.at,
                           signals=rules.decision_signals())
    assert inc.data.target_rate_window_s == {slow: 240.0}
    for sig in COUNTERS:
        if sig in full.series[slow]:
            np.testing.assert_array_equal(inc.data.values(slow, sig), full.values(slow, sig), err_msg=sig.value)


class _Recorder:
    """A Prometheus that answers nothing and remembers what it was asked."""

    url = "http://recorder"

    def __init__(self) -> None:
        self.queries: list[str] = []

    def instant(self, query: str, at: datetime) -> list:
        self.queries.append(query)
        return []

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list:
        self.queries.append(query)
        return []


def test_a_slow_target_with_relabel_leftovers_is_re_read_without_them() -> None:
    """A slow TGI target whose series were relabelled (leftovers found by core/churn): its
    re-read expressions (the KV proxy divides two gauges) go through newest_scrape, as the
    leftover re-read does, so the old series' frozen values are not summed back in; a slow
    target without leftovers is read plainly."""
    from kvwatch.core.dialects import DIALECT_BY_ID
    from kvwatch.core.frame import FleetData
    from kvwatch.core.models import Target
    from kvwatch.core.pipeline import read_slow_targets

    names = frozenset(n for srcs in DIALECT_BY_ID["tgi"].sources.values() for s in srcs for n in s.requires)
    t = Target(TargetKey("tgi", "slow:8000"), "tgi", "tgi", "m", names)
    at = datetime.fromtimestamp(1_800_000_000, tz=UTC)
    for leftovers, fresh in ((frozenset({t.key}), True), (frozenset(), False)):
        data = FleetData(grid=np.arange(61) * 30.0, targets={t.key: t}, leftovers=leftovers)
        client = _Recorder()
        read_slow_targets(client, data, [t], {t.key: 240.0}, latency_s=600.0, signals=None, user_matchers="",
                          collect_kw={"at": at, "window_s": 1800.0, "step_s": 30.0})
        kv = [q for q in client.queries if "tgi_batch_current_max_tokens" in q and "_bucket" not in q]
        assert kv, client.queries
        assert all(("timestamp(" in q) is fresh for q in kv), kv
        assert data.target_rate_window_s == {t.key: 240.0}
