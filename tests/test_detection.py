"""Detection time on phase schedules in a real Prometheus, replayed with the backtest.

A healthy engine that goes full, one whose scheduler wedges, and a healthy control
(kvwatch.sim.phases; ground truth checked) are backfilled with promtool and replayed step
by step (discover → collect → diagnose → alert lifecycle). kvwatch must raise full and
idle (stalled) within 5 minutes of the change and before the static
``min_over_time(kv_usage[5m]) > 0.9`` alert measured on the same data, raise nothing
else, and clear after the recovery.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.prom import backfill, prometheus

from kvwatch.config import load_settings
from kvwatch.core.promclient import PromClient
from kvwatch.core.rules import load_ruleset
from kvwatch.sim.corpus import default_end_time
from kvwatch.sim.openmetrics import write_openmetrics
from kvwatch.sim.vocab import Dialect
from kvwatch.tools.backtest.replay import run_backtest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import detection as bench

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

MIN = 60.0


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bench.Measured]:
    work = tmp_path_factory.mktemp("detect")
    end = default_end_time()
    runs = {}
    for fault, seed, dialect in (("full", 7, Dialect.VLLM_0_10), ("stalled", 7, Dialect.SGLANG_0_5),
                                 (None, 7, Dialect.TRTLLM_SERVE)):
        target, run, _ = bench._draw((fault, seed, dialect.value, end, bench.SCRAPE_S))  # the benchmark's own schedule
        runs[run.spec.instance()] = (target, run)
    write_openmetrics([r for _, r in runs.values()], work / "fleet.om", job="phases")
    backfill(work / "fleet.om", work / "tsdb")
    start = end - (bench.TOTAL_S - bench.WARMUP_S) + 1800
    with prometheus(work / "tsdb") as url:
        client = PromClient(url, timeout_s=120)
        result = run_backtest(client, load_settings(None, environ={}), load_ruleset(),
                              datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC), bench.STEP_S)
        static = bench.static_alert(client, start, end)
    ms = bench.measure(result, runs, static)
    print("\n" + bench.report(ms))
    return {m.fault: m for m in ms}


@pytest.mark.parametrize("fault", ["full", "stalled"])
def test_detected_within_five_minutes_and_before_the_static_alert(measured, fault: str) -> None:
    m = measured[fault]
    assert m.detect_s is not None and m.detect_s <= 5 * MIN, m
    assert m.static_detect_s is None or m.detect_s < m.static_detect_s, m
    assert not m.wrong and not m.renamed and not m.after_recovery, m
    assert m.clear_after_truth_s is not None and m.clear_after_truth_s <= 10 * MIN, m
    assert m.healthy_flagged == 0, m


def test_the_static_alert_is_slower_on_full_and_blind_to_a_stall(measured) -> None:
    assert measured["full"].static_detect_s is not None and measured["full"].static_detect_s >= 5 * MIN
    assert measured["stalled"].static_detect_s is None


def test_a_healthy_control_raises_nothing(measured) -> None:
    m = measured["control"]
    assert m.healthy_steps > 100 and m.healthy_flagged == 0 and not m.wrong and not m.after_recovery, m
