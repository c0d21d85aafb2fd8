"""Per-step discovery for the backtest: at every step, the targets ``kvwatch once --at t`` would find.

The discovery, stale and ``up`` queries of :mod:`kvwatch.core.discover` are sent
once each as *range* queries over the steps: a range query evaluates its
expression at every step exactly as an instant query at that time would (same
lookback), so the answer at step ``t`` is the instant answer ``once --at t`` gets.
The same parsers then turn each step's rows into targets: a dialect upgrade, a
model relabel or a pod that left scraping (``gone``) shows at the step it
happens. Queries: two (three when some target goes stale), more only when the
steps exceed :data:`~kvwatch.tools.backtest.history.MAX_POINTS` (chunks).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from kvwatch.core.discover import (
    discovery_query,
    parse_discovery,
    stale_keys,
    stale_query,
    stale_targets,
    up_query,
)
from kvwatch.core.models import Target
from kvwatch.core.promclient import QueryClient, Series

#: tolerance when matching answer timestamps to steps (float seconds)
_EPS = 1e-3


def rows_by_step(client: QueryClient, query: str, steps: Sequence[float], max_points: int) -> list[list[Series]]:
    """``query`` evaluated at every step (range query, chunked), as instant-style rows per step."""
    step_s = steps[1] - steps[0] if len(steps) > 1 else 1.0
    index = {round(t / _EPS): i for i, t in enumerate(steps)}
    out: list[list[Series]] = [[] for _ in steps]
    for lo in range(0, len(steps), max_points):
        hi = min(lo + max_points, len(steps)) - 1
        start, end = (datetime.fromtimestamp(steps[k], tz=UTC) for k in (lo, hi))
        for series in client.range(query, start, end, step_s):
            row = {"metric": series.get("metric", {})}
            for ts, _ in series.get("values", []):
                i = index.get(round(float(ts) / _EPS))
                if i is not None:
                    out[i].append(row)
    return out


def _signature(rows: list[Series]) -> frozenset[tuple[tuple[str, str], ...]]:
    return frozenset(tuple(sorted(r["metric"].items())) for r in rows)


def discover_steps(
    client: QueryClient,
    steps: Sequence[float],
    window_s: float,
    user_matchers: str,
    allowed: tuple[str, ...] = (),
    max_points: int = 10_000,
) -> list[list[Target]]:
    """Per step, the targets :func:`kvwatch.core.discover.discover` returns at that instant.

    Steps must be evenly spaced. Consecutive steps with the same answers share one
    parsed list, so parsing costs O(changes), not O(steps × series).
    """
    live_rows = rows_by_step(client, discovery_query(user_matchers), steps, max_points)
    stale_rows = rows_by_step(client, stale_query(user_matchers, window_s), steps, max_points)
    lives: list[list[Target]] = []
    stales = []
    cache: dict[frozenset[tuple[tuple[str, str], ...]], list[Target]] = {}
    for rows, srows in zip(live_rows, stale_rows, strict=True):
        sig = _signature(rows)
        if sig not in cache:
            cache[sig] = parse_discovery(rows, allowed)
        lives.append(cache[sig])
        stales.append(stale_keys(cache[sig], srows))
    # like `discover`: ask for `up` only when some target went stale
    up_rows = rows_by_step(client, up_query(user_matchers), steps, max_points) if any(stales) else None
    out: list[list[Target]] = []
    for i, (live, stale) in enumerate(zip(lives, stales, strict=True)):
        out.append(live + stale_targets(stale, up_rows[i]) if stale and up_rows is not None else live)
    return out
