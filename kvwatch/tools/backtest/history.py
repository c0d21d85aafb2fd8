"""Fetch the history a backtest replays: one range query per (signal, source) and identity generation.

The whole span ``[T0 − window, T1]`` is fetched at the data resolution with the
same queries as :func:`kvwatch.core.collect.collect` (its grid is anchored at ``T1``,
so the last step sees exactly the samples ``kvwatch once --at T1`` sees).
Prometheus caps a range answer at 11,000 points per series, so a span longer
than :data:`MAX_POINTS` resolutions is fetched in consecutive chunks: the query
count grows with the span length / 10,000 steps, never with the number of
evaluation steps or targets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from kvwatch.core.churn import read_leftovers_exactly
from kvwatch.core.collect import collect, resolve
from kvwatch.core.frame import FleetData
from kvwatch.core.models import Target, TargetKey
from kvwatch.core.pipeline import read_slow_targets
from kvwatch.core.promclient import QueryClient, Series
from kvwatch.durations import parse_duration

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
    #: targets scraped slower than the fleet → their own rate window, s (core/scrape.py)
    slow: Mapping[TargetKey, float] = field(default_factory=dict)


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
        when = datetime.fromtimestamp(at, tz=UTC)
        same = dict(  # the plain reading and the exact re-read of relabel leftovers (core/churn.py)
            at=when, window_s=n * res, step_s=res, rate_window=spec.rate_window, latency_window=spec.latency_window,
            max_concurrency=spec.max_concurrency,
            hold_static=False,  # each step must see the cap / pool size of its own time
        )
        data = collect(client, targets, user_matchers=spec.user_matchers, **same)  # type: ignore[arg-type]
        read_leftovers_exactly(
            client, data, targets,
            lambda few, sel, sigs, same=same: collect(client, few, user_matchers=sel, signals=sigs, fresh=True,
                                                      **same),  # type: ignore[arg-type]
            at=when, window_s=n * res, step_s=res, user_matchers=spec.user_matchers,
            rate_window_s=parse_duration(spec.rate_window), signals=None)
        read_slow_targets(client, data, targets, spec.slow,
                          latency_s=parse_duration(spec.latency_window or spec.rate_window), signals=None,
                          user_matchers=spec.user_matchers, collect_kw=same)
        parts.append(data)
        hi -= n + 1
    parts.reverse()
    out = _concat(parts, targets)
    # the windows the counters were read with, as `once` records them (facts such as
    # queue_reach_s and preemption_reach_s subtract them)
    out.rate_window_s = parse_duration(spec.rate_window)
    out.target_rate_window_s = dict(spec.slow)
    return out


def source_sig(target: Target) -> frozenset:
    """A target's data identity: the sources its signals resolve to (renames that change none share data)."""
    return frozenset(resolve(target).items())


def fetch_layers(
    client: QueryClient, per_step: list[list[Target]], spec: HistorySpec
) -> tuple[list[FleetData], dict[tuple[TargetKey, frozenset], int]]:
    """History of every identity the steps saw, one layer per identity generation.

    Layer *i* holds each target's *i*-th distinct set of sources (e.g. a vLLM upgrade
    from ``gpu_cache_usage_perc`` to ``kv_cache_usage_perc``: layer 0 the old names,
    layer 1 the new), so every step reads the sources ``once --at t`` would. Without
    changes there is one layer; a query is sent once whichever layers need it, so a change
    costs only the queries of sources no earlier layer used (O(changes), never O(steps)).
    Returns the layers and ``(key, source_sig) → layer index``.
    """
    layer_of: dict[tuple[TargetKey, frozenset], int] = {}
    count: dict[TargetKey, int] = {}
    reps: list[dict[TargetKey, Target]] = []
    for targets in per_step:
        for t in targets:
            sig = source_sig(t)
            if not sig or (t.key, sig) in layer_of:
                continue  # stale/gone targets have no sources: nothing to fetch
            i = count.get(t.key, 0)
            count[t.key] = i + 1
            layer_of[(t.key, sig)] = i
            while len(reps) <= i:
                reps.append({})
            reps[i][t.key] = t
    # queries select every target of the scope, so a later layer repeats most of the earlier ones' queries
    fetcher: QueryClient = _Memo(client) if len(reps) > 1 else client
    layers = [fetch_history(fetcher, sorted(r.values(), key=lambda t: (t.key.job, t.key.instance)), spec)
              for r in reps] or [fetch_history(client, [], spec)]
    return layers, layer_of


class _Memo:
    """Answers a query already sent from memory: each layer then costs only the queries of its new sources.

    Used only while fetching several layers (the answers stay in memory until all are built).
    """

    def __init__(self, client: QueryClient) -> None:
        self._client = client
        self.url = client.url
        self._answers: dict[tuple[object, ...], list[Series]] = {}

    def instant(self, query: str, at: datetime) -> list[Series]:
        key = ("instant", query, at)
        if key not in self._answers:
            self._answers[key] = self._client.instant(query, at)
        return self._answers[key]

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[Series]:
        key = ("range", query, start, end, step_s)
        if key not in self._answers:
            self._answers[key] = self._client.range(query, start, end, step_s)
        return self._answers[key]
