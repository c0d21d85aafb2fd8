"""One evaluation: discover → collect → diagnose, with I/O injected.

The steps are separate functions so the service's incremental evaluator
(``kvwatch/service/incremental.py``) runs the same discovery, collection and
diagnosis on the parts it fetches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

from kvwatch.config import Settings
from kvwatch.core.bounds import straddled
from kvwatch.core.churn import (
    fresh_span,
    rate_signals,
    read_leftovers_exactly,
    start_leftover_probe,
)
from kvwatch.core.collect import (
    bucket_layouts,
    ceilings_of,
    collect,
    instances_matcher,
    join_matchers,
)
from kvwatch.core.diagnose import Params, diagnose
from kvwatch.core.discover import discover
from kvwatch.core.explain import explain_keys
from kvwatch.core.frame import FleetData
from kvwatch.core.models import Evaluation, Target, TargetKey
from kvwatch.core.promclient import QueryClient
from kvwatch.core.rules import RuleSet
from kvwatch.core.scrape import detect_intervals, rate_window, slower_than_fleet
from kvwatch.core.selector import parse_selector, render_matchers
from kvwatch.core.shard import Shard
from kvwatch.core.signals import Signal
from kvwatch.durations import format_duration


def scope_matchers(settings: Settings) -> str:
    """The user's ``discovery.selector`` as matchers added to every query."""
    return render_matchers(parse_selector(settings.discovery.selector, "discovery.selector"))


def find_targets(client: QueryClient, settings: Settings, at: datetime) -> list[Target]:
    """Discovered targets of this replica's shard (all of them when unsharded)."""
    targets = discover(client, at, settings.evaluation.window, scope_matchers(settings), settings.discovery.dialects,
                       settings.discovery.triton_model)
    shard = Shard(settings.shard.index, settings.shard.count, settings.shard.by)
    return shard.select(targets) if shard.active else targets


@dataclass(frozen=True)
class Probes:
    """What collection measures besides the signals; both change rarely.

    ``interval_s``: the fleet's scrape interval (``core/scrape.py``; None: not measurable),
    which widens the rate and latency windows; ``intervals``: each target's own, which gives
    the targets scraped slower than the fleet their own windows. ``ceilings``: per target and quantile signal the
    highest finite histogram bound in signal units (``collect.ceilings_of``); ``layouts``:
    every finite bound (``collect.bucket_layouts``; empty: not measured).
    """

    interval_s: float | None
    ceilings: Mapping[TargetKey, Mapping[Signal, float]]
    layouts: Mapping[TargetKey, Mapping[Signal, tuple[float, ...]]] = field(default_factory=dict)
    #: each target's own scrape interval, s (empty: not measured)
    intervals: Mapping[TargetKey, float] = field(default_factory=dict)


def _matchers(settings: Settings, targets: list[Target], only_these: bool) -> str:
    matchers = scope_matchers(settings)
    if only_these or settings.shard.count > 1:
        matchers = join_matchers(matchers, instances_matcher([t.key for t in targets]))
    return matchers


def measure_probes(client: QueryClient, settings: Settings, targets: list[Target], at: datetime) -> Probes:
    """The scrape interval and bucket ceilings of ``targets`` at ``at``, as a full fetch measures them.

    Costs one raw-sample probe per KV usage family and one instant query per histogram family.
    """
    if not targets:
        return Probes(None, {})
    matchers = _matchers(settings, targets, False)
    layouts = bucket_layouts(client, targets, matchers, at)
    fleet, own = detect_intervals(client, at, targets, matchers)
    return Probes(fleet, ceilings_of(layouts), layouts, own)


def collect_targets(
    client: QueryClient, settings: Settings, rules: RuleSet, targets: list[Target], at: datetime,
    window_s: float | None = None, only_these: bool = False, probes: Probes | None = None,
    signals: Set[Signal] | None = None, leftovers: frozenset[TargetKey] | None = None,
) -> FleetData:
    """Collect ``targets`` over ``window_s`` (default: the evaluation window) ending at ``at``.

    ``only_these`` (always when sharded) restricts every query to these targets'
    instances, so Prometheus evaluates only their series. ``probes`` (default: measured
    now) are the scrape interval and bucket ceilings when the caller already has them.
    ``signals`` (default: all) are the signals fetched (a cycle fetches the decision
    signals first, :func:`triage_fetch` the rest for the targets that need them).
    Targets with leftovers of relabelled series (:mod:`kvwatch.core.churn`) get their gauges
    re-read exactly; ``leftovers`` is the caller's finding when it has one (the triage pass
    reuses the decision pass'), else they are looked for (one query per KV family).
    """
    ev = settings.evaluation
    matchers = _matchers(settings, targets, only_these)
    # counters and histograms need >= 4 samples per window: widen the configured windows
    # when the data are scraped slowly (Grafana's $__rate_interval)
    if probes is not None:
        interval, own = probes.interval_s, probes.intervals
    else:
        interval, own = detect_intervals(client, at, targets, matchers) if targets else (None, {})
    rate_s, latency_s = rate_window(ev.rate_window, interval), rate_window(ev.latency_window, interval)
    window = ev.window if window_s is None else window_s
    same = dict(  # what the plain reading and the exact re-read of relabel leftovers share
        at=at, window_s=window, step_s=ev.step, rate_window=format_duration(rate_s),
        latency_window=format_duration(latency_s), range_signals=rules.condition_signals(),
        max_concurrency=settings.prometheus.max_concurrency, triton_model=settings.discovery.triton_model,
        ceilings=None if probes is None else probes.ceilings, layouts=None if probes is None else probes.layouts,
    )
    # the leftover probe shares the signal queries' workers: it runs beside them, not after them
    with ThreadPoolExecutor(max_workers=settings.prometheus.max_concurrency) as pool:
        probe = start_leftover_probe(client, targets, at=at, window_s=window, step_s=ev.step,
                                     user_matchers=matchers, fresh_s=fresh_span(rate_s), pool=pool) \
            if leftovers is None and targets else None
        data = collect(client, targets, user_matchers=matchers, signals=signals, pool=pool, **same)  # type: ignore[arg-type]
        known = frozenset(t.key for t in probe()) if probe is not None else leftovers or frozenset()
    read_leftovers_exactly(
        client, data, targets,
        lambda few, sel, sigs: collect(client, few, user_matchers=sel, signals=sigs, fresh=True, **same),  # type: ignore[arg-type]
        at=at, window_s=window, step_s=ev.step, user_matchers=matchers, rate_window_s=rate_s, signals=signals,
        known=known)
    data.rate_window_s, data.scrape_interval_s = rate_s, interval
    read_slow_targets(client, data, targets, slower_than_fleet(ev.rate_window, interval, own), latency_s=latency_s,
                      signals=signals, user_matchers=matchers, collect_kw=same)
    return data


def read_slow_targets(client: QueryClient, data: FleetData, targets: list[Target], slow: Mapping[TargetKey, float],
                      *, latency_s: float, signals: Set[Signal] | None, user_matchers: str,
                      collect_kw: Mapping[str, object]) -> None:
    """Re-read the rate-based signals of the targets scraped slower than the fleet with their own window.

    ``slow`` maps those targets to their rate window (``scrape.slower_than_fleet``); one
    :func:`collect` per distinct window (with ``collect_kw``, the caller's other arguments),
    restricted to its targets' instances. Their latency window is the fleet's or their rate
    window, whichever is longer. A row the re-read lacks keeps the fleet-window reading (a
    gap, not a loss); gauges are not re-read; targets with relabel leftovers are read fresh.
    """
    by_window: dict[float, list[Target]] = {}
    for t in targets:
        if t.key in slow:
            by_window.setdefault(slow[t.key], []).append(t)
    for rw, few in sorted(by_window.items()):
        sigs = rate_signals(few, signals)
        if not sigs:
            continue
        keys = [t.key for t in few]
        kw = {**collect_kw, "rate_window": format_duration(rw), "latency_window": format_duration(max(latency_s, rw))}
        got = collect(client, few, user_matchers=join_matchers(user_matchers, instances_matcher(keys)), signals=sigs,
                      fresh=bool(data.leftovers) and any(k in data.leftovers for k in keys),  # type: ignore[operator]
                      **kw)  # type: ignore[arg-type]
        for t in few:
            mine, exact = data.series.setdefault(t.key, {}), got.series.get(t.key, {})
            for sig in sigs:
                if sig in exact and len(exact[sig]) == len(data.grid):
                    mine[sig] = exact[sig]
            data.target_rate_window_s[t.key] = rw


#: above this share of the targets, the triage-only signals are fetched for every target
#: (no instance matcher): measured in benchmarks/README.md ("Triage-only signals")
TRIAGE_ALL_SHARE = 0.5


def triage_fetch(
    client: QueryClient, settings: Settings, rules: RuleSet, targets: list[Target], data: FleetData, at: datetime,
) -> Callable[[list[TargetKey]], FleetData]:
    """What :func:`~kvwatch.core.diagnose.diagnose` calls for the triage-only signals of the
    targets with a matched rule: one query per (signal, source) for all of them at once,
    restricted to their instances (escaped for RE2, rows kept by (job, instance)), or
    unrestricted when they are more than :data:`TRIAGE_ALL_SHARE` of ``targets``. Read at
    ``at`` with the scrape interval and bucket layouts ``data`` was collected with."""
    by_key = {t.key: t for t in targets}
    probes = Probes(data.scrape_interval_s, data.ceilings, data.buckets)

    def fetch(keys: list[TargetKey]) -> FleetData:
        subset = [by_key[k] for k in keys if k in by_key]
        few = len(subset) <= TRIAGE_ALL_SHARE * len(targets)
        return collect_targets(client, settings, rules, subset, at, only_these=few, probes=probes,
                               signals=rules.triage_signals(), leftovers=data.leftovers)

    return fetch


def _seconds(x: float) -> str:
    return f"{x:g} s"


def slo_bucket_note(targets: list[Target], data: FleetData, slo_s: float) -> str | None:
    """A remark where the TTFT SLO (s) lies strictly inside a TTFT histogram bucket of some
    targets: a p99 anywhere in that bucket is an interpolation that cannot be compared with the
    SLO (misread's "over the SLO" is then not established), so the bucket's bounds are the SLOs
    the data can decide. None where every layout has the SLO as a bound (or none is known)."""
    inside: dict[tuple[float, float], list[TargetKey]] = {}
    for t in targets:
        bounds = data.buckets.get(t.key, {}).get(Signal.TTFT_P99)
        # the SLO's own bucket, where the SLO is not a bound: any value there straddles it
        bucket = straddled(slo_s, slo_s, bounds) if bounds else None
        if bucket is not None:
            inside.setdefault(bucket, []).append(t.key)
    if not inside:
        return None
    (lo, hi), keys = max(inside.items(), key=lambda kv: len(kv[1]))
    n = sum(len(v) for v in inside.values())
    choices = " or ".join(_seconds(b) for b in (lo, hi) if b > 0)
    return (f"the TTFT SLO ({_seconds(slo_s)}, evaluation.ttft_slo) lies inside the TTFT bucket "
            f"({lo:g}, {hi:g}] of {n} of {len(targets)} targets (e.g. {keys[0]}): a p99 between "
            f"{_seconds(lo)} and {_seconds(hi)} cannot be compared with it (misread stays unestablished "
            f"there); an SLO at a bucket bound, {choices}, can be decided")


def counted(
    client: QueryClient, settings: Settings, at: datetime,
    body: Callable[[], tuple[list[Target], FleetData]], rules: RuleSet, explain: str | None = None,
) -> Evaluation:
    """Run ``body`` (targets and their decision signals), diagnose (fetching the triage-only
    signals of the targets with a matched rule), and report this run's queries and warnings."""
    ev = settings.evaluation
    stats = getattr(client, "stats", None)
    before = getattr(stats, "queries", 0)
    warnings_before = getattr(stats, "warnings_total", 0)
    targets, data = body()
    params = Params(at=at.timestamp(), window_s=ev.window, step_s=ev.step, ttft_slo_s=ev.ttft_slo,
                    latency_window_s=rate_window(ev.latency_window, data.scrape_interval_s))
    keys = explain_keys([t.key for t in targets], explain) if explain else frozenset()
    # ``body`` fetched the decision signals: the triage-only ones follow for flagged targets
    results = diagnose(targets, data, rules, params, explain=keys,
                       triage=triage_fetch(client, settings, rules, targets, data, at))
    queries = getattr(stats, "queries", 0) - before
    # only this cycle's warnings: a client is reused across cycles by the service
    if hasattr(stats, "warnings_since"):
        seen = stats.warnings_since(warnings_before)
    else:
        seen = getattr(stats, "warnings", [])
    warnings = tuple(dict.fromkeys(seen))[:10]
    note = slo_bucket_note(targets, data, ev.ttft_slo)
    return Evaluation(evaluated_at=at, results=results, window_s=ev.window, queries=queries, warnings=warnings,
                      rate_window_s=data.rate_window_s, scrape_interval_s=data.scrape_interval_s,
                      target_rate_windows=dict(data.target_rate_window_s), notes=(note,) if note else ())


def evaluate(
    client: QueryClient, settings: Settings, rules: RuleSet, at: datetime, explain: str | None = None
) -> Evaluation:
    """Evaluate every discovered target at ``at``. Raises PrometheusError when Prometheus fails.

    ``explain``: a ``job/instance`` (or instance, or part of one) whose every rule condition
    is recorded for ``kvwatch explain``."""
    def body() -> tuple[list[Target], FleetData]:
        targets = find_targets(client, settings, at)
        return targets, collect_targets(client, settings, rules, targets, at, signals=rules.decision_signals())

    return counted(client, settings, at, body, rules, explain)
