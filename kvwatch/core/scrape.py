"""Scrape interval detected from the data, and rate windows sized from it.

A ``rate()`` needs two samples in its window; with 60 s scrapes a 2-minute window often
holds one (scrape jitter, one missed scrape) and counter signals go missing. Like
Grafana's ``$__rate_interval``, kvwatch uses ``max(configured window, 4 × scrape
interval)``. The interval is measured on the raw samples of the KV usage series (every
engine exports one): per series the median gap between samples, then the slow end of the
fleet (90th percentile over series), so (nearly) every target gets ≥ 4 samples per window.
Gaps are measured between samples, so a series younger than the probe is measured right.

A fleet is rarely scraped alike: one slow job (a 60 s scrape among 15 s ones, under the
90th percentile) would get the fleet's window and lose samples. Such targets are
:func:`slower_than_fleet`: their rate-based signals are re-read with their own window
(``core/pipeline.py``), one more query per signal and window class, not per target.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime

import numpy as np

from kvwatch.core.dialects import DIALECT_BY_ID, selector
from kvwatch.core.models import Target, TargetKey, target_key
from kvwatch.core.promclient import QueryClient
from kvwatch.core.signals import Signal
from kvwatch.errors import PrometheusBadResponse

#: span of raw samples read per KV usage series, s (≥ 3 samples up to 100 s scrapes)
PROBE_S = 300.0
#: samples a rate window should hold (Grafana: 4 × scrape interval)
SAMPLES_PER_WINDOW = 4
#: which series' interval sets the window: the slow end of the fleet, not one outlier
QUANTILE = 0.9


def interval_queries(targets: Iterable[Target], user_matchers: str) -> list[str]:
    """Raw KV usage samples over the probe span, one range selector per KV family in use."""
    out: set[str] = set()
    for t in targets:
        d = DIALECT_BY_ID.get(t.dialect)
        for src in d.sources.get(Signal.KV_USAGE, ()) if d is not None else ():
            if all(n in t.names for n in src.requires):
                out.add(f"{selector(src.metric, src.matchers, user_matchers)}[{PROBE_S:g}s]")
                break
    return sorted(out)


def _gaps(row: object) -> float | None:
    values = row.get("values") if isinstance(row, dict) else None
    try:
        ts = np.asarray([float(p[0]) for p in values], dtype=float) if values is not None else None
    except (TypeError, ValueError, IndexError):
        return None
    if ts is None or len(ts) < 3:
        return None
    gap = float(np.median(np.diff(ts)))
    return gap if math.isfinite(gap) and gap > 0 else None


def detect_intervals(client: QueryClient, at: datetime, targets: Iterable[Target],
                     user_matchers: str) -> tuple[float | None, dict[TargetKey, float]]:
    """(the fleet's scrape interval, each target's own), seconds.

    The fleet's is the 90th percentile over series (None: too few samples, or Prometheus
    refused the probe); a target's is the largest median gap of its KV usage series.
    """
    gaps: list[float] = []
    own: dict[TargetKey, float] = {}
    for q in interval_queries(targets, user_matchers):
        try:
            rows = client.instant(q, at)
        except PrometheusBadResponse:
            continue
        for row in rows:
            gap = _gaps(row)
            if gap is None:
                continue
            gaps.append(gap)
            metric = row.get("metric") if isinstance(row, dict) else None
            if isinstance(metric, dict) and "instance" in metric:
                key = target_key(metric)
                own[key] = max(own.get(key, 0.0), gap)
    return (float(np.quantile(gaps, QUANTILE)) if gaps else None), own


def detect_interval(client: QueryClient, at: datetime, targets: Iterable[Target], user_matchers: str) -> float | None:
    """The fleet's scrape interval in seconds (None: too few samples, or Prometheus refused the probe)."""
    return detect_intervals(client, at, targets, user_matchers)[0]


#: a target's own window must exceed the fleet's by this factor to be read apart: scrape
#: jitter moves a median gap by a few percent, and a re-read costs queries
SLOWER_BY = 1.25
#: own windows are rounded up to this many seconds, so near-equal intervals share one re-read
WINDOW_QUANTUM_S = 60.0
#: slack before rounding up: a median gap a few percent over the interval (scrape jitter,
#: measured at another instant) must not push a window into the next quantum
JITTER = 0.05


def slower_than_fleet(configured_s: float, fleet_s: float | None, own: Mapping[TargetKey, float]) -> dict[TargetKey, float]:
    """The targets whose own rate window (from their interval) exceeds the fleet's, and that window, s.

    ``configured_s`` is the configured rate window; windows are rounded up to whole minutes.
    Empty when the fleet's interval is unknown (then every window is the configured one).
    """
    if fleet_s is None:
        return {}
    fleet_w = rate_window(configured_s, fleet_s)
    out: dict[TargetKey, float] = {}
    for key, interval in own.items():
        w = rate_window(configured_s, interval)
        if w > SLOWER_BY * fleet_w:
            out[key] = float(max(1, math.ceil(w / (1 + JITTER) / WINDOW_QUANTUM_S)) * WINDOW_QUANTUM_S)
    return out


def rate_window(configured_s: float, interval_s: float | None) -> float:
    """``max(configured, 4 × interval)``, rounded up to whole seconds."""
    if interval_s is None:
        return configured_s
    return max(configured_s, float(math.ceil(SAMPLES_PER_WINDOW * interval_s)))
