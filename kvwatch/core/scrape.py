"""Scrape interval detected from the data, and rate windows sized from it.

A ``rate()`` needs two samples in its window; with 60 s scrapes a 2-minute window often
holds one (scrape jitter, one missed scrape) and counter signals go missing. Like
Grafana's ``$__rate_interval``, kvwatch uses ``max(configured window, 4 × scrape
interval)``. The interval is measured on the raw samples of the KV usage series (every
engine exports one): per series the median gap between samples, then the slow end of the
fleet (90th percentile over series), so (nearly) every target gets ≥ 4 samples per window.
Gaps are measured between samples, so a series younger than the probe is measured right.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime

import numpy as np

from kvwatch.core.dialects import DIALECT_BY_ID, selector
from kvwatch.core.models import Target
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


def detect_interval(client: QueryClient, at: datetime, targets: Iterable[Target], user_matchers: str) -> float | None:
    """The scrape interval in seconds (None: too few samples, or Prometheus refused the probe)."""
    gaps: list[float] = []
    for q in interval_queries(targets, user_matchers):
        try:
            rows = client.instant(q, at)
        except PrometheusBadResponse:
            continue
        gaps.extend(g for g in map(_gaps, rows) if g is not None)
    return float(np.quantile(gaps, QUANTILE)) if gaps else None


def rate_window(configured_s: float, interval_s: float | None) -> float:
    """``max(configured, 4 × interval)``, rounded up to whole seconds."""
    if interval_s is None:
        return configured_s
    return max(configured_s, float(math.ceil(SAMPLES_PER_WINDOW * interval_s)))
