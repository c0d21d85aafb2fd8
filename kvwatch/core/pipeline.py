"""One evaluation: discover → collect → diagnose, with I/O injected."""

from __future__ import annotations

from datetime import datetime

from kvwatch.config import Settings
from kvwatch.core.collect import collect, instances_matcher, join_matchers
from kvwatch.core.diagnose import Params, diagnose
from kvwatch.core.discover import discover
from kvwatch.core.explain import explain_keys
from kvwatch.core.models import Evaluation
from kvwatch.core.promclient import QueryClient
from kvwatch.core.rules import RuleSet
from kvwatch.core.selector import parse_selector, render_matchers
from kvwatch.core.shard import Shard
from kvwatch.durations import format_duration


def evaluate(
    client: QueryClient, settings: Settings, rules: RuleSet, at: datetime, explain: str | None = None
) -> Evaluation:
    """Evaluate every discovered target at ``at``. Raises PrometheusError when Prometheus fails.

    ``explain``: a ``job/instance`` (or instance, or part of one) whose every rule condition
    is recorded for ``kvwatch explain``."""
    ev = settings.evaluation
    matchers = render_matchers(parse_selector(settings.discovery.selector, "discovery.selector"))
    stats = getattr(client, "stats", None)
    before = getattr(stats, "queries", 0)
    warnings_before = getattr(stats, "warnings_total", 0)
    targets = discover(client, at, ev.window, matchers, settings.discovery.dialects)
    shard = Shard(settings.shard.index, settings.shard.count, settings.shard.by)
    collect_matchers = matchers
    if shard.active:  # only this shard's targets, and Prometheus only evaluates their series
        targets = shard.select(targets)
        collect_matchers = join_matchers(matchers, instances_matcher([t.key for t in targets]))
    data = collect(
        client,
        targets,
        at=at,
        window_s=ev.window,
        step_s=ev.step,
        rate_window=format_duration(ev.rate_window),
        latency_window=format_duration(ev.latency_window),
        range_signals=rules.condition_signals(),
        user_matchers=collect_matchers,
        max_concurrency=settings.prometheus.max_concurrency,
    )
    params = Params(at=at.timestamp(), window_s=ev.window, step_s=ev.step, ttft_slo_s=ev.ttft_slo)
    keys = explain_keys([t.key for t in targets], explain) if explain else frozenset()
    results = diagnose(targets, data, rules, params, explain=keys)
    queries = getattr(stats, "queries", 0) - before
    # only this cycle's warnings: a client is reused across cycles by the service
    if hasattr(stats, "warnings_since"):
        seen = stats.warnings_since(warnings_before)
    else:
        seen = getattr(stats, "warnings", [])
    warnings = tuple(dict.fromkeys(seen))[:10]
    return Evaluation(evaluated_at=at, results=results, window_s=ev.window, queries=queries, warnings=warnings)
