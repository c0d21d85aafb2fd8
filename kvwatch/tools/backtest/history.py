"""Fetch the history a backtest replays: discovery over the span, one range query per (signal, source).

The whole span ``[T0 − window, T1]`` is fetched at the data resolution with the
same queries as :func:`kvwatch.core.collect.collect` (its grid is anchored at ``T1``,
so the last step sees exactly the samples ``kvwatch once --at T1`` sees).
Prometheus caps a range answer at 11,000 points per series, so a span longer
than :data:`MAX_POINTS` resolutions is fetched in consecutive chunks: the query
count grows with the span length / 10,000 steps, never with the number of
evaluation steps or targets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from kvwatch.core.collect import collect
from kvwatch.core.dialects import all_names, selector
from kvwatch.core.discover import _INFO_LABELS, discovery_query, parse_discovery
from kvwatch.core.frame import FleetData
from kvwatch.core.models import Target
from kvwatch.core.promclient import QueryClient
from kvwatch.durations import format_duration

#: grid points per range query (Prometheus refuses more than 11,000 per series)
MAX_POINTS = 10_000


@dataclass(frozen=True)
class HistorySpec:
    """What to fetch. Times are Unix seconds; ``resolution_s`` is the evaluation step of the data."""

    start: float
    end: float
    window_s: float
    resolution_s: float
    rate_window: str
    user_matchers: str
    #: window of histogram quantiles/means (None: the rate window), as in `kvwatch once`
    latency_window: str | None = None
    dialects: tuple[str, ...] = ()
    max_concurrency: int = 4
    max_points: int = MAX_POINTS


def span_discovery_query(user_matchers: str, span_s: float) -> str:
    """Every (name, target) that had a sample during the last ``span_s`` seconds.

    ``last_over_time`` keeps ``__name__``, so the same parser as live discovery applies.
    """
    regex = "|".join(re.escape(n) for n in all_names())
    sel = selector("", f'__name__=~"{regex}"', user_matchers)
    labels = ", ".join(_INFO_LABELS)
    return f"group by (__name__, job, instance, {labels}) (last_over_time({sel}[{format_duration(span_s)}]))"


def discover_span(client: QueryClient, spec: HistorySpec) -> list[Target]:
    """Targets live at ``end`` (exactly as ``once --at end`` finds them) plus those seen during the span.

    A target gone before ``end`` keeps the dialect its names had during the span,
    so its history is diagnosed rather than reported as a bare blind spot.
    """
    end = datetime.fromtimestamp(spec.end, tz=UTC)
    live = parse_discovery(client.instant(discovery_query(spec.user_matchers), end), spec.dialects)
    seen = {t.key for t in live}
    span = spec.end - spec.start + spec.window_s
    past = parse_discovery(client.instant(span_discovery_query(spec.user_matchers, span), end), spec.dialects)
    out = live + [t for t in past if t.key not in seen]
    out.sort(key=lambda t: (t.key.job, t.key.instance))
    return out


def _concat(parts: list[FleetData], targets: list[Target]) -> FleetData:
    """Join chunk grids (oldest first); a series missing in a chunk becomes NaN there."""
    if len(parts) == 1:
        return parts[0]
    grid = np.concatenate([p.grid for p in parts])
    out = FleetData(grid=grid, targets={t.key: t for t in targets})
    out.sourced = parts[0].sourced
    for t in targets:
        sigs = {s for p in parts for s in p.series.get(t.key, {})}
        for s in sigs:
            chunks = [p.values(t.key, s) for p in parts]
            out.put(t.key, s, np.concatenate([np.full(len(p.grid), np.nan) if c is None else c
                                              for p, c in zip(parts, chunks, strict=True)]))
    return out


def fetch_history(client: QueryClient, targets: list[Target], spec: HistorySpec) -> FleetData:
    """All signals of ``targets`` on one grid ``end − k·resolution`` covering ``[start − window, end]``."""
    res = spec.resolution_s
    total = int((spec.end - spec.start + spec.window_s) // res)  # intervals; points = total + 1
    parts: list[FleetData] = []
    # newest chunk first, then walk back; each chunk ends one resolution before the next begins
    hi = total
    while hi >= 0:
        n = min(hi, spec.max_points - 1)
        at = spec.end - (total - hi) * res
        parts.append(
            collect(
                client,
                targets,
                at=datetime.fromtimestamp(at, tz=UTC),
                window_s=n * res,
                step_s=res,
                rate_window=spec.rate_window,
                latency_window=spec.latency_window,
                user_matchers=spec.user_matchers,
                max_concurrency=spec.max_concurrency,
            )
        )
        hi -= n + 1
    parts.reverse()
    return _concat(parts, targets)
