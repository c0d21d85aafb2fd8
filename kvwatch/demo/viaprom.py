"""The Prometheus demo backend: simulated fleet → OpenMetrics → promtool → Prometheus → pipeline.

The fleet is scraped every :data:`~kvwatch.demo.fleet.SCRAPE_S` simulated seconds, written with the
simulator's OpenMetrics writer into a :class:`~kvwatch.demo.promrun.Scratch` temp dir,
backfilled with ``promtool`` and served by a throwaway Prometheus on a loopback port;
then the real pipeline (discovery, PromQL collection, diagnosis) runs at the fleet's
end instant. Scratch owns every process and file: they go on return, error or Ctrl-C.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kvwatch.config import Settings
from kvwatch.core.models import Evaluation
from kvwatch.core.rules import RuleSet
from kvwatch.errors import KvwatchError

if TYPE_CHECKING:
    from kvwatch.demo.fleet import DemoFleet


def evaluate_via_prometheus(settings: Settings, rules: RuleSet, seed: int, warmup_s: float,
                            progress: Callable[[str], None]) -> tuple[Evaluation, DemoFleet]:
    """Backfill the simulated fleet into a throwaway Prometheus and run :func:`kvwatch.core.pipeline.evaluate`.

    Raises KvwatchError when the binaries are missing or promtool/Prometheus fail
    (their log tail in the message); PrometheusError when a query fails.
    """
    from kvwatch.core.pipeline import evaluate
    from kvwatch.core.promclient import PromClient
    from kvwatch.demo import fleet_duration, now
    from kvwatch.demo.fleet import SCRAPE_S, simulate_fleet
    from kvwatch.demo.promrun import Scratch, find_binaries
    from kvwatch.sim.openmetrics import write_openmetrics

    binaries = find_binaries()
    if binaries is None:
        raise KvwatchError("demo --backend prometheus needs `prometheus` and `promtool` on PATH")
    prometheus, promtool = binaries
    at = now()
    fleet = simulate_fleet(seed, duration_s=fleet_duration(settings), warmup_s=warmup_s,
                           scrape_s=SCRAPE_S, end_time=at.timestamp(), progress=progress)
    with Scratch() as scratch:
        om = scratch.dir / "fleet.om"
        stats = write_openmetrics(fleet.runs, om, job=fleet.job)
        progress(f"backfilling {stats.series} series ({stats.samples} samples) with promtool")
        tsdb = scratch.dir / "tsdb"
        try:
            scratch.backfill(promtool, om, tsdb)
            om.unlink()  # blocks hold it now; no need to keep ~50 MB around
            progress("starting a throwaway prometheus on 127.0.0.1")
            url = scratch.prometheus(prometheus, tsdb)
        except RuntimeError as exc:
            raise KvwatchError(f"demo --backend prometheus: {exc}") from exc
        progress(f"evaluating {len(fleet.runs)} engines via {url}")
        client = PromClient(url, timeout_s=60)
        evaluation = evaluate(client, settings, rules, at)
    return evaluation, fleet
