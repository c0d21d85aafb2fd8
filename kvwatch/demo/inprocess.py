"""The in-process demo backend: simulated engines' exposition → FleetData → diagnose.

No Prometheus: each simulated engine's series (its dialect's real names, labels and
buckets, :func:`kvwatch.sim.expose.families`) go through discovery's dialect detection
(:func:`kvwatch.core.discover.parse_discovery`) and :func:`kvwatch.core.dialects.resolve`, and each
resolved source is evaluated on them the way its PromQL would be
(:mod:`kvwatch.demo.promlite`). So a dialect's blind spots, units and histogram
resolution are the same as against a real Prometheus.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvwatch.config import Settings
from kvwatch.core.collect import resolve
from kvwatch.core.diagnose import Params, diagnose
from kvwatch.core.dialects import SourceKind
from kvwatch.core.discover import parse_discovery
from kvwatch.core.frame import FleetData
from kvwatch.core.models import Evaluation, Target
from kvwatch.core.promclient import Series
from kvwatch.core.rules import RuleSet
from kvwatch.demo.fleet import DemoFleet, target_key
from kvwatch.demo.promlite import Exposed, evaluate_source, expr_fallback
from kvwatch.sim.expose import families
from kvwatch.sim.fleet import TargetRun


def exposed(run: TargetRun) -> Exposed:
    """Every series the engine exposes, over its scrape times."""
    spec = run.spec
    return Exposed(families(spec.dialect, run.views(), spec.model_name),
                   np.asarray(run.wall_times, dtype=float))


def discovered(run: TargetRun, series: Exposed, job: str) -> Target | None:
    """The target discovery finds for these series (None: they match no dialect)."""
    key = target_key(run.spec, job)
    rows: list[Series] = [
        {"metric": {**lb, "__name__": name, "job": key.job, "instance": key.instance}}
        for name in sorted(series.names) for lb in series.labels(name)
    ]
    found = parse_discovery(rows)
    return found[0] if found else None


def fleet_data(fleet: DemoFleet, grid: np.ndarray, rate_window: float,
               latency_window: float) -> tuple[list[Target], FleetData]:
    """Targets and the signals their dialect sources yield, on ``grid`` (Unix s, a subset
    of the scrape times). Engines matching no dialect are left out, as discovery would."""
    targets: list[Target] = []
    data = FleetData(grid=grid, targets={}, rate_window_s=rate_window)  # as a Prometheus fetch records it
    for run in fleet.runs:
        series = exposed(run)
        target = discovered(run, series, fleet.job)
        if target is None:
            continue
        targets.append(target)
        data.targets[target.key] = target
        sources = resolve(target)
        data.sourced[target.key] = set(sources)
        pos = np.searchsorted(run.wall_times, grid)
        if (pos >= len(run.wall_times)).any() or not np.allclose(run.wall_times[pos], grid):
            raise ValueError("the evaluation grid is not on the simulated scrape times")
        for sig, src in sources.items():
            if src.kind is SourceKind.EXPR:
                values = expr_fallback(sig, run, rate_window)
            else:
                values = evaluate_source(src, series, rate_window, latency_window)
            if values is not None:  # None: the query returns nothing, "(no data)"
                data.put(target.key, sig, values[pos])
    return targets, data


def latency_window(settings: Settings) -> float:
    """Window of histogram quantiles and means, s (the rate window when not configured)."""
    return float(getattr(settings.evaluation, "latency_window", None) or settings.evaluation.rate_window)


def evaluate_inprocess(settings: Settings, rules: RuleSet, seed: int, warmup_s: float,
                       progress: Callable[[str], None]) -> tuple[Evaluation, DemoFleet]:
    """Simulate the demo fleet, derive every exported signal and diagnose it."""
    from kvwatch.demo import fleet_duration, now
    from kvwatch.demo.fleet import SCRAPE_S, simulate_fleet

    ev = settings.evaluation
    at = now()
    fleet = simulate_fleet(seed, duration_s=fleet_duration(settings), warmup_s=warmup_s,
                           scrape_s=SCRAPE_S, end_time=at.timestamp(), progress=progress)
    progress(f"diagnosing {len(fleet.runs)} simulated engines in process")
    n = int(ev.window // ev.step)
    grid = at.timestamp() - ev.step * np.arange(n, -1, -1, dtype=float)
    targets, data = fleet_data(fleet, grid, ev.rate_window, latency_window(settings))
    params = Params(at=at.timestamp(), window_s=ev.window, step_s=ev.step, ttft_slo_s=ev.ttft_slo,
                    latency_window_s=latency_window(settings))
    results = diagnose(targets, data, rules, params)
    return Evaluation(evaluated_at=at, results=results, window_s=ev.window, queries=0), fleet
