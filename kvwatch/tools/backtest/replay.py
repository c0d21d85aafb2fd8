"""Replay the pipeline over history: per step diagnose a window view, then advance the lifecycle.

:func:`replay` is pure (history in memory → result); :func:`run_backtest` adds
the Prometheus edge: per-step discovery (range queries answering what
``once --at t`` discovers at every step) and collection of every identity a
target had (one set of range queries per identity generation, see
:func:`~kvwatch.tools.backtest.history.fetch_layers`).
Steps are anchored at ``T1``: ``T1, T1 − step, …`` down to the first one ``≥ T0``,
so the last step is exactly what ``kvwatch once --at T1`` evaluates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from kvwatch.alerting.lifecycle import Incident, IncidentKey, IncidentState, Lifecycle
from kvwatch.config import LifecycleSettings, Settings
from kvwatch.core.diagnose import Params, diagnose
from kvwatch.core.frame import FleetData
from kvwatch.core.models import FailureMode, Target, TargetKey
from kvwatch.core.promclient import QueryClient
from kvwatch.core.rules import RuleSet
from kvwatch.core.scrape import detect_intervals, rate_window, slower_than_fleet
from kvwatch.core.selector import parse_selector, render_matchers
from kvwatch.durations import format_duration, parse_duration
from kvwatch.errors import ConfigError
from kvwatch.tools.backtest.history import MAX_POINTS, HistorySpec, fetch_layers, source_sig
from kvwatch.tools.backtest.identity import discover_steps
from kvwatch.tools.backtest.models import BacktestResult, IncidentRecord, ModeChange, TargetTimeline
from kvwatch.tools.backtest.window import StepView, first_seen, overlay

#: tolerance for "is a multiple of" checks on float seconds
_EPS = 1e-6


@dataclass(frozen=True)
class ReplayParams:
    """Window, data resolution, SLO and lifecycle settings of the replayed service (seconds)."""

    window_s: float
    resolution_s: float
    ttft_slo_s: float
    lifecycle: LifecycleSettings
    latency_window_s: float = 600.0


def step_times(start: float, end: float, step_s: float) -> tuple[float, ...]:
    """``end − k·step`` for k = n … 0 with every time ≥ ``start`` (oldest first)."""
    if step_s <= 0 or end < start:
        raise ConfigError(f"backtest: need step > 0 and --from <= --to (got step {step_s:g}s)")
    n = math.floor((end - start) / step_s + _EPS)
    return tuple(end - k * step_s for k in range(n, -1, -1))


def check_step(step_s: float, resolution_s: float) -> None:
    """The backtest step must be a whole multiple of the data resolution (else steps fall off the grid)."""
    ratio = step_s / resolution_s
    if step_s <= 0 or abs(ratio - round(ratio)) > 1e-9 or round(ratio) < 1:
        raise ConfigError(
            f"--step: got {format_duration(step_s)}, expected a multiple of the data resolution "
            f"({format_duration(resolution_s)}; set it with --resolution or evaluation.step)"
        )


class _IncidentLog:
    """Collects fired incidents across lifecycle steps, keyed by (incident key, start)."""

    def __init__(self) -> None:
        self.records: dict[tuple[IncidentKey, float], IncidentRecord] = {}

    def observe(self, incidents: dict[IncidentKey, Incident], at: float) -> None:
        """Record the incidents after the lifecycle step at ``at`` (Unix s)."""
        for key, inc in incidents.items():
            if inc.fired_at is None:
                continue  # pending only: never raised
            prev = self.records.get((key, inc.started_at))
            modes = prev.modes if prev is not None else ()
            if not modes or modes[-1].mode is not inc.mode:  # opened, or another mode took over
                modes = (*modes, ModeChange(inc.fired_at if not modes else at, inc.mode, inc.rule_id))
            self.records[(key, inc.started_at)] = IncidentRecord(
                mode=inc.mode,
                severity=inc.severity,
                rule=inc.rule_id,
                pending_at=inc.started_at,
                opened_at=inc.fired_at,
                resolved_at=inc.resolved_at if inc.state is IncidentState.RESOLVED else None,
                resolution=inc.resolution,
                modes=modes,
            )

    def for_target(self, key: TargetKey) -> tuple[IncidentRecord, ...]:
        recs = [r for (k, _), r in self.records.items() if k.target == key]
        return tuple(sorted(recs, key=lambda r: (r.opened_at, r.mode.rank)))


def replay(
    targets: Sequence[Target],
    data: FleetData,
    rules: RuleSet,
    params: ReplayParams,
    steps: Sequence[float],
    *,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[TargetTimeline, ...]:
    """Evaluate every step on a window view of ``data``; targets join at their first sample.

    The lifecycle starts empty at the first step, like a service started at ``T0``:
    a condition already matching then fires after its ``for`` (start earlier to
    warm up). Assuming it had held all along would fire on every transient at ``T0``.
    """
    seen_from = first_seen(data)
    per_step = [[tg for tg in targets if seen_from.get(tg.key, math.inf) <= t + _EPS] for t in steps]
    route = {(tg.key, source_sig(tg)): 0 for tg in targets}
    return replay_steps(per_step, [data], route, rules, params, steps, progress=progress)


def replay_steps(
    per_step: Sequence[Sequence[Target]],
    layers: list[FleetData],
    layer_of: dict[tuple[TargetKey, frozenset], int],
    rules: RuleSet,
    params: ReplayParams,
    steps: Sequence[float],
    *,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[TargetTimeline, ...]:
    """Evaluate step ``i`` on the targets ``per_step[i]`` (what discovery found then), each reading its layer.

    A target absent from a step, or present as ``gone``, resolves its incidents as gone through
    the lifecycle, exactly as in ``kvwatch run``. A timeline carries the target's last identity.
    """
    lifecycle = Lifecycle(params.lifecycle)
    incidents: dict[IncidentKey, Incident] = {}
    log = _IncidentLog()
    last: dict[TargetKey, Target] = {}
    times: dict[TargetKey, list[float]] = {}
    states: dict[TargetKey, list[FailureMode]] = {}
    for i, (t, present) in enumerate(zip(steps, per_step, strict=True)):
        route = {tg.key: j for tg in present if (j := layer_of.get((tg.key, source_sig(tg)))) is not None}
        view = StepView(layers, route, list(present), t, params.window_s)
        p = Params(at=t, window_s=params.window_s, step_s=params.resolution_s, ttft_slo_s=params.ttft_slo_s,
                   latency_window_s=params.latency_window_s)
        results = diagnose(list(present), view, rules, p)
        for r in results:
            last[r.target.key] = r.target
            times.setdefault(r.target.key, []).append(t)
            states.setdefault(r.target.key, []).append(r.state)
        incidents, _events = lifecycle.step(incidents, results, t)
        log.observe(incidents, t)
        if progress is not None:
            progress(i + 1, len(steps))
    return tuple(
        TargetTimeline(last[k], tuple(times[k]), tuple(states[k]), log.for_target(k))
        for k in sorted(last, key=lambda k: (k.job, k.instance))
    )


def run_backtest(
    client: QueryClient,
    settings: Settings,
    rules: RuleSet,
    start: datetime,
    end: datetime,
    step_s: float | None = None,
) -> BacktestResult:
    """Discover per step (a few range queries), fetch each identity's history once, replay in memory."""
    ev = settings.evaluation
    step = ev.step if step_s is None else step_s
    check_step(step, ev.step)
    steps = step_times(start.timestamp(), end.timestamp(), step)
    matchers = render_matchers(parse_selector(settings.discovery.selector, "discovery.selector"))
    before = getattr(getattr(client, "stats", None), "queries", 0)
    per_step = discover_steps(client, steps, ev.window, matchers, settings.discovery.dialects, MAX_POINTS)
    # windows sized from the scrape interval as `once` sizes them, measured at the end of the
    # span (a target gone by then keeps the fleet's window)
    seen = list({t.key: t for targets in per_step for t in targets}.values())
    interval, own = detect_intervals(client, end, seen, matchers) if seen else (None, {})
    spec = HistorySpec(
        start=steps[0],
        end=end.timestamp(),
        window_s=ev.window,
        resolution_s=ev.step,
        rate_window=format_duration(rate_window(ev.rate_window, interval)),
        latency_window=format_duration(rate_window(ev.latency_window, interval)),
        user_matchers=matchers,
        dialects=settings.discovery.dialects,
        max_concurrency=settings.prometheus.max_concurrency,
        slow=slower_than_fleet(ev.rate_window, interval, own),
    )
    layers, layer_of = fetch_layers(client, per_step, spec)
    queries = getattr(getattr(client, "stats", None), "queries", 0) - before
    params = ReplayParams(ev.window, ev.step, ev.ttft_slo, settings.lifecycle, parse_duration(spec.latency_window))
    timelines = replay_steps(per_step, layers, layer_of, rules, params, steps)
    return BacktestResult(
        start=start.timestamp(),
        end=end.timestamp(),
        step_s=step,
        window_s=ev.window,
        resolution_s=ev.step,
        steps=steps,
        timelines=timelines,
        queries=queries,
        history=overlay(layers),
    )
