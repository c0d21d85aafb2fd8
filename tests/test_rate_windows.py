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
from datetime import UTC, datetime

import numpy as np
import pytest
from fixtures.core import fleet
from support.prom import backfill, prometheus

from kvwatch.config import load_settings
from kvwatch.core.collect import collect
from kvwatch.core.discover import discover
from kvwatch.core.models import FailureMode
from kvwatch.core.pipeline import evaluate
from kvwatch.core.promclient import PromClient
from kvwatch.core.rules import load_ruleset
from kvwatch.core.scrape import detect_interval
from kvwatch.core.signals import Signal

pytestmark = [pytest.mark.prometheus]

INTERVALS = (15.0, 30.0, 60.0)
COUNTERS = (Signal.GEN_TPS, Signal.PROMPT_TPS, Signal.REQUEST_RATE, Signal.PREEMPTIONS)
SPAN = 3000.0


def _member(w: fleet._Writer, interval: float, end: float) -> None:
    t0 = end - SPAN
    n = int(SPAN // interval)
    # scrape k lands within ±2 s of its slot (deterministic jitter); the last one exactly at end
    times = [t0 + k * interval + (2.0 * math.sin(1.7 * k) if k < n else 0.0) for k in range(n + 1)]
    fleet.write_engine(w, "vllm-0.33", {"job": "vllm", "instance": f"i{interval:g}:8000", "engine": "0"}, times, t0,
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
