"""The stand-in rules of ``test_alerts_live`` (tests/fixtures/alerts/rules.yaml), cycle by cycle.

The live mode-change test restarts one simulated engine into ``full``: the fresh engine's pool
starts empty and fills within seconds. Its stand-in ``oscillating`` rule must not read that one
fill as a swing, or the incident opens as OSCILLATING whenever a scrape lands in the ramp (CI at
b843e18 failed so). A square-wave pool, the live ``oscillating`` preset, must still match it.
These traces use the live test's evaluation (step 2 s, window 60 s) and are diagnosed at every
cycle as they unfold, as ``kvwatch run`` sees them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvwatch.core.diagnose import Params, diagnose
from kvwatch.core.frame import FleetData
from kvwatch.core.models import FailureMode, Target, TargetKey
from kvwatch.core.rules import load_ruleset
from kvwatch.core.signals import Signal

RULES = load_ruleset([Path(__file__).parent / "fixtures" / "alerts" / "rules.yaml"])
STEP, WINDOW = 2.0, 60.0
T0 = 1_000_000.0


def states(kv: np.ndarray, waiting: np.ndarray, start: int) -> list[FailureMode]:
    """The primary state at each step from ``start`` on (one cycle per step, a 60 s window)."""
    t = Target(TargetKey("vllm", "t"), "vllm-v1", "vllm", "m")
    out = []
    n = int(WINDOW // STEP) + 1
    for end in range(start, len(kv)):
        lo = max(0, end + 1 - n)
        grid = T0 + STEP * np.arange(lo, end + 1)
        data = FleetData(grid=grid, targets={t.key: t})
        sigs = {Signal.KV_USAGE: kv[lo:end + 1], Signal.WAITING: waiting[lo:end + 1],
                Signal.PREEMPTIONS: np.zeros(end + 1 - lo), Signal.RUNNING: np.full(end + 1 - lo, 30.0)}
        data.sourced[t.key] = set(sigs)
        for s, v in sigs.items():
            data.put(t.key, s, v)
        (r,) = diagnose([t], data, RULES, Params(at=float(grid[-1]), window_s=WINDOW, step_s=STEP, ttft_slo_s=2.0))
        out.append(r.state)
    return out


def first_alert(seq: list[FailureMode]) -> FailureMode | None:
    return next((s for s in seq if s not in (FailureMode.HEALTHY, FailureMode.UNKNOWN)), None)


@pytest.mark.parametrize("spikes", [False, True])
def test_a_restart_into_full_opens_as_full_not_as_a_swing(spikes: bool) -> None:
    """``spikes``: the live healthy-busy engine is 70-80 % used on average but reaches 90-95 %
    now and then (its p90 is 84 %); one such spike before the restart plus the fill after it
    made two excursions to >= 90 % and the incident opened as OSCILLATING (CI at 2ed0f3d..dd9576a)."""
    rng = np.random.default_rng(7)
    for ramp in (1, 2, 3, 5):  # samples the fresh pool takes to fill (scrape timing and load vary it)
        busy = 0.75 + rng.uniform(-0.05, 0.05, 40)  # healthy-busy: 70-80 %, no queue
        if spikes:
            busy[[25, 31, 37]] = (0.92, 0.95, 0.93)
        fill = np.linspace(0.0, 0.97, ramp + 1)[:-1]
        pinned = 0.97 + rng.uniform(-0.02, 0.02, 40)
        kv = np.concatenate([busy, fill, pinned])
        waiting = np.concatenate([np.zeros(40), np.zeros(ramp), np.full(40, 6.0)])
        seq = states(kv, waiting, start=20)
        assert first_alert(seq) == FailureMode.FULL, (ramp, seq)
        assert seq[-1] == FailureMode.FULL, (ramp, seq)


def test_a_square_wave_after_full_reads_oscillating() -> None:
    for period_steps in (3, 5, 8):  # the preset's 3-8 sim-minutes at 30x clock: 6-16 s
        pinned = np.full(40, 0.97)
        t = np.arange(40)
        wave = np.where((t % period_steps) < period_steps / 2, 0.95, 0.05)
        kv = np.concatenate([pinned, [0.0], wave])
        waiting = np.concatenate([np.full(40, 6.0), [0.0], np.where(wave > 0.5, 3.0, 0.0)])
        seq = states(kv, waiting, start=30)
        assert first_alert(seq) == FailureMode.FULL, (period_steps, seq)
        assert FailureMode.OSCILLATING in seq[15:], (period_steps, seq)
        assert seq[-1] == FailureMode.OSCILLATING, (period_steps, seq)
