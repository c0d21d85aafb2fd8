"""The in-process demo backend: simulated ground truth → FleetData → diagnose."""

from __future__ import annotations

from collections.abc import Callable

from kvwatch.config import Settings
from kvwatch.diagnose import Params, diagnose
from kvwatch.models import Evaluation
from kvwatch.ruleset import RuleSet


def evaluate_inprocess(settings: Settings, rules: RuleSet, seed: int, warmup_s: float,
                       progress: Callable[[str], None]) -> tuple[Evaluation, dict[str, str]]:
    """Simulate the fleet, derive every signal and diagnose it; also the expected mode per target."""
    from kvwatch.demo import now
    from kvwatch.demo.fleet import fleet_data, simulate

    ev = settings.evaluation
    sims = simulate(seed, warmup_s + ev.window, ev.step, progress)
    at = now()
    progress(f"diagnosing {len(sims)} simulated engines")
    targets, data = fleet_data(sims, at.timestamp(), ev.window, ev.step, ev.rate_window)
    params = Params(at=at.timestamp(), window_s=ev.window, step_s=ev.step, ttft_slo_s=ev.ttft_slo)
    results = diagnose(targets, data, rules, params)
    expected = {str(s.key): s.expected for s in sims}
    return Evaluation(evaluated_at=at, results=results, window_s=ev.window, queries=0), expected
