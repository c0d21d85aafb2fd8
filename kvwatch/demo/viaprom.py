"""The Prometheus demo backend: simulated fleet → OpenMetrics → promtool → Prometheus → pipeline."""

from __future__ import annotations

from collections.abc import Callable

from kvwatch.config import Settings
from kvwatch.errors import KvwatchError
from kvwatch.models import Evaluation
from kvwatch.ruleset import RuleSet


def evaluate_via_prometheus(settings: Settings, rules: RuleSet, seed: int, warmup_s: float,
                            progress: Callable[[str], None]) -> tuple[Evaluation, dict[str, str]]:
    """Backfill the simulated fleet into a throwaway Prometheus and run :func:`kvwatch.pipeline.evaluate`."""
    try:
        from kvwatch.sim import openmetrics  # noqa: F401
    except ImportError:
        raise KvwatchError(
            "demo --backend prometheus needs the simulator's OpenMetrics export (kvwatch.sim.openmetrics), "
            "which this build lacks; use --backend inprocess"
        ) from None
    raise KvwatchError("demo --backend prometheus: OpenMetrics backfill is not wired up yet; use --backend inprocess")
