"""Leftovers of relabelled series: found with one cheap query per KV family, re-read exactly.

When a label of an engine's series changes (a pod hash or version label after a rollout)
the old series stops. A scraping Prometheus marks it stale at once, but data that were
backfilled, imported or federated may carry no staleness markers: the old series' last
value then stays visible for the 5-minute lookback next to the new one, and the per-target
``sum``/``max`` of every gauge counts both (running and waiting doubled, a KV value frozen).

Reading every gauge through :func:`~kvwatch.core.dialects.model.newest_scrape` would fix it
at a join per step and series (+60 % Prometheus CPU on a full 1,000-target cycle, measured).
Instead one query per KV family finds the targets with more visible series than were
scraped in the last half rate window anywhere in the span, or whose number of series
changes within it; only their gauge signals are fetched again through ``newest_scrape``,
restricted to their instances, replacing the plain reading. A target scraped more slowly
than that has no series in the short window at some steps: the comparison finds no match
there and flags nothing (data-parallel engines of one scrape count alike on both sides).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Set
from concurrent.futures import Executor
from datetime import datetime, timedelta

from kvwatch.core.collect import instances_matcher, join_matchers, too_large
from kvwatch.core.dialects import BY, selector
from kvwatch.core.dialects.model import SourceKind
from kvwatch.core.dialects.table import resolve
from kvwatch.core.frame import FleetData
from kvwatch.core.models import Target, TargetKey, target_key
from kvwatch.core.promclient import QueryClient
from kvwatch.core.signals import Signal
from kvwatch.durations import format_duration
from kvwatch.errors import PrometheusBadResponse, PrometheusTimeout

#: the family whose series count tells a target's leftovers (every engine exports one of them)
_PROBED = (Signal.KV_USAGE, Signal.RUNNING, Signal.WAITING)
#: source kinds that read instant gauges (EXPR sources may; re-reading a rate is harmless)
_GAUGE_KINDS = frozenset({SourceKind.GAUGE, SourceKind.EXPR})


def fresh_span(rate_window_s: float) -> float:
    """The probe's short window, s: half the rate window (at least 2 scrape intervals, as the
    rate window holds at least 4)."""
    return rate_window_s / 2.0


def leftover_queries(targets: list[Target], user_matchers: str, fresh_s: float) -> dict[str, set[TargetKey]]:
    """PromQL → the targets it probes: per (job, instance), present at the steps where more
    series of the family are visible than were scraped in the last ``fresh_s`` seconds (a
    leftover stays visible for the 5-minute lookback; ``fresh_s`` is >= 2 scrape intervals),
    or where their number differs from the span's end (the relabel step itself, when both
    series were scraped within ``fresh_s``; a store with a short lookback shows only that
    step). Costs about two gauge queries (measured; ``@ end()`` is evaluated once)."""
    fresh = format_duration(max(fresh_s, 1.0))
    out: dict[str, set[TargetKey]] = defaultdict(set)
    for t in targets:
        srcs = resolve(t)
        src = next((srcs[s] for s in _PROBED if s in srcs), None)
        if src is None:
            continue
        sel = selector(src.metric, src.matchers if src.kind is SourceKind.GAUGE else "", user_matchers)
        n = f"count by ({BY}) ({sel})"
        out[f"({n} > count by ({BY}) (last_over_time({sel}[{fresh}])))"
            f" or ({n} != count by ({BY}) ({sel} @ end()))"].add(t.key)
    return dict(out)


def find_leftovers(client: QueryClient, targets: list[Target], *, at: datetime, window_s: float, step_s: float,
                   user_matchers: str, fresh_s: float) -> list[Target]:
    """The targets with a leftover series at some step of [at − window, at]. A store that
    refuses the probe (HTTP 4xx) or times out on it finds none there (read as before); an
    unreachable or failing one (5xx) fails the cycle like any other query."""
    return start_leftover_probe(client, targets, at=at, window_s=window_s, step_s=step_s,
                                user_matchers=user_matchers, fresh_s=fresh_s)()


def start_leftover_probe(
    client: QueryClient, targets: list[Target], *, at: datetime, window_s: float, step_s: float,
    user_matchers: str, fresh_s: float, pool: Executor | None = None,
) -> Callable[[], list[Target]]:
    """:func:`find_leftovers` with its queries submitted to ``pool`` (the collection's, so the
    probe shares its concurrency limit and runs beside the signal queries instead of after
    them); returns what waits for them and gives the finding. Without a pool the queries run
    when it is called."""
    start = at - timedelta(seconds=step_s * int(window_s // step_s))  # collect()'s grid
    by_key = {t.key: t for t in targets}
    probes = leftover_queries(targets, user_matchers, fresh_s)

    def one(query: str) -> list[object]:
        try:
            return client.range(query, start, at, step_s)
        except PrometheusTimeout:  # too slow for the probe: read as before
            return []
        except PrometheusBadResponse as exc:
            if exc.refused or too_large(exc):  # a store that refuses it (`@`, sample limits): read as before
                return []
            raise  # a server failure fails the cycle like any other query, not silently partial

    pending = {q: pool.submit(one, q) for q in probes} if pool is not None else {}

    def finding() -> list[Target]:
        hit: set[TargetKey] = set()
        for query, keys in probes.items():
            for row in pending[query].result() if query in pending else one(query):
                labels = row.get("metric", {}) if isinstance(row, dict) else {}
                key = target_key(labels)
                if key in keys and len(row.get("values", ())) > 0:  # type: ignore[union-attr]
                    hit.add(key)
        return [by_key[k] for k in by_key if k in hit]

    return finding


def gauge_signals(targets: list[Target], signals: Set[Signal] | None) -> frozenset[Signal]:
    """The requested signals that some of ``targets`` read from instant gauges."""
    out = {s for t in targets for s, src in resolve(t).items() if src.kind in _GAUGE_KINDS}
    return frozenset(out if signals is None else out & set(signals))


#: sources read at an instant, with no rate or latency window
_PLAIN_KINDS = frozenset({SourceKind.GAUGE, SourceKind.VLLM_CACHE_INFO})


def rate_signals(targets: list[Target], signals: Set[Signal] | None) -> frozenset[Signal]:
    """The requested signals that some of ``targets`` read through a window (counters,
    histograms, expressions that may hold a ``rate``)."""
    out = {s for t in targets for s, src in resolve(t).items() if src.kind not in _PLAIN_KINDS}
    return frozenset(out if signals is None else out & set(signals))


def replace_leftovers(data: FleetData, refetch: Callable[[list[Target], frozenset[Signal]], FleetData],
                      flagged: list[Target], signals: Set[Signal] | None) -> None:
    """Overwrite the gauge signals of ``flagged`` in ``data`` with ``refetch``'s exact reading
    (same grid); a signal the re-read lacks keeps its plain value."""
    sigs = gauge_signals(flagged, signals)
    if not flagged or not sigs:
        return
    exact = refetch(flagged, sigs)
    for t in flagged:
        got = exact.series.get(t.key, {})
        mine = data.series.setdefault(t.key, {})
        for sig in sigs:
            if sig in got and len(got[sig]) == len(data.grid):
                mine[sig] = got[sig]


#: fetch(targets, user matchers, signals): the caller's collection, gauges read through newest_scrape
Refetch = Callable[[list[Target], str, frozenset[Signal]], FleetData]


def read_leftovers_exactly(client: QueryClient, data: FleetData, targets: list[Target], fetch: Refetch, *,
                           at: datetime, window_s: float, step_s: float, user_matchers: str, rate_window_s: float,
                           signals: Set[Signal] | None, known: frozenset[TargetKey] | None = None) -> None:
    """Find the targets of ``data`` with leftovers (or take ``known``, a finding of the same span)
    and overwrite their gauge signals with ``fetch``'s exact reading, restricted to their
    instances; records the finding in ``data.leftovers``. The probe's short window is half the
    rate window: at least 2 scrape intervals, as the rate window holds at least 4."""
    if known is None:
        flagged = find_leftovers(client, targets, at=at, window_s=window_s, step_s=step_s,
                                 user_matchers=user_matchers, fresh_s=fresh_span(rate_window_s)) if targets else []
    else:
        flagged = [t for t in targets if t.key in known]
    replace_leftovers(data, lambda few, sigs: fetch(
        few, join_matchers(user_matchers, instances_matcher([t.key for t in few])), sigs), flagged, signals)
    data.leftovers = frozenset(t.key for t in flagged)
