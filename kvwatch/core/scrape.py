"""Scrape interval detected from the data, and rate windows sized from it.

A ``rate()`` needs two samples in its window; with 60 s scrapes a 2-minute window often
holds one (scrape jitter, one missed scrape) and counter signals go missing. Like
Grafana's ``$__rate_interval``, kvwatch uses ``max(configured window, 4 × scrape
interval)``, with the interval measured from the KV usage series (every engine exports
one): the slow end of the evaluated fleet (90th percentile of the per-series intervals)
sets it, so (nearly) every target gets ≥ 4 samples per window.
"""

from __future__ import annotations

import math
from datetime import datetime

from kvwatch.core.dialects import DIALECTS, selector
from kvwatch.core.promclient import QueryClient
from kvwatch.core.signals import Signal
from kvwatch.errors import PrometheusBadResponse

#: span over which samples are counted, s
PROBE_S = 600.0
#: samples a rate window should hold (Grafana: 4 × scrape interval)
SAMPLES_PER_WINDOW = 4
#: which series' interval sets the window: the slow end of the fleet, not one outlier
QUANTILE = 0.9


def interval_query(user_matchers: str) -> str:
    """Seconds between samples of the slowest-scraped KV usage series (one instant query)."""
    names = sorted({s.requires[0] for d in DIALECTS for s in d.sources.get(Signal.KV_USAGE, ())})
    sel = selector("", f'__name__=~"{"|".join(names)}"', user_matchers)
    # per series: probe span / gaps between its samples; the 90th percentile over series is
    # the slow end of the fleet without letting one just-started target (few samples) set it
    per_series = f"{PROBE_S:g} / ((count_over_time({sel}[{PROBE_S:g}s]) > 1) - 1)"
    return f"quantile({QUANTILE:g}, {per_series})"


def detect_interval(client: QueryClient, at: datetime, user_matchers: str) -> float | None:
    """The scrape interval in seconds (None: no series, or Prometheus refused the probe)."""
    try:
        rows = client.instant(interval_query(user_matchers), at)
    except PrometheusBadResponse:
        return None
    for row in rows:
        try:
            v = float(row["value"][1])  # type: ignore[index]
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if math.isfinite(v) and v > 0:
            return v
    return None


def rate_window(configured_s: float, interval_s: float | None) -> float:
    """``max(configured, 4 × interval)``, rounded up to whole seconds."""
    if interval_s is None:
        return configured_s
    return max(configured_s, float(math.ceil(SAMPLES_PER_WINDOW * interval_s)))
