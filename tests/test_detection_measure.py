"""How the detection benchmark reads a replay (benchmarks/detection.py ``measure``), on
constructed incident records: no simulation, no Prometheus."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from kvwatch.core.models import FailureMode, Severity, Target, TargetKey
from kvwatch.sim.phases import build
from kvwatch.sim.vocab import Dialect
from kvwatch.tools.backtest.models import BacktestResult, IncidentRecord, ModeChange, TargetTimeline

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import detection as bench

MIN = 60.0


def _measure(*incidents: IncidentRecord) -> bench.Measured:
    """One oscillating schedule (simulated time = Unix time) whose replay raised ``incidents``."""
    target = build("oscillating", 1, Dialect.TRTLLM_SERVE)
    target = SimpleNamespace(**{**target.__dict__, "recovered_at": target.recover_at + 60})
    run = SimpleNamespace(wall_times=[0.0], sim_times=[0.0])
    inst = target.spec.instance()
    tl = TargetTimeline(Target(TargetKey("phases", inst), "trtllm-serve", "trtllm"), (), (), incidents)
    result = BacktestResult(0.0, 1.0, 30.0, 1800.0, 30.0, (), (tl,))
    (m,) = bench.measure(result, {inst: (target, run)}, {})
    return m


def _incident(fault_at: float, *modes: tuple[float, FailureMode, str]) -> IncidentRecord:
    changes = tuple(ModeChange(fault_at + at_min * MIN, mode, rule) for at_min, mode, rule in modes)
    return IncidentRecord(modes[-1][1], Severity.WARNING, modes[-1][2], changes[0].at, changes[0].at,
                          fault_at + 40 * MIN, "cleared", changes)


def test_an_oscillation_first_named_full_in_its_own_incident_is_renamed_not_wrong() -> None:
    """Issue 11: the first peak of an oscillation pinned with a growing queue is named `full`
    (nothing tells it apart until the pool drains and refills); the same incident becomes
    `oscillating` at the refill. That is the fault named late (counted in periods), not an
    incident that is not the fault; a separate `full` incident is."""
    fault_at = build("oscillating", 1, Dialect.TRTLLM_SERVE).fault_at
    osc = (FailureMode.OSCILLATING, "oscillating-kv-swings")
    full = (FailureMode.FULL, "full-kv-pressure-fast")
    m = _measure(_incident(fault_at, (4.0, *full), (8.5, *osc)))
    assert m.detect_s == 8.5 * MIN and m.opened_s == 4.0 * MIN
    assert m.wrong == [] and m.renamed == ["full-kv-pressure-fast@+4.0m"], m
    m = _measure(_incident(fault_at, (4.0, *full)), _incident(fault_at, (8.5, *osc)))
    assert m.detect_s == 8.5 * MIN and m.wrong == ["full-kv-pressure-fast@+4.0m"] and m.renamed == [], m
