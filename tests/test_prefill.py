"""The admission queue behind the Dynamo frontend's prefill-counting queue gauge (core/diagnose/prefill.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvwatch.core.diagnose.prefill import admission_queue
from kvwatch.core.frame import FleetData
from kvwatch.core.models import Target, TargetKey
from kvwatch.core.signals import Signal

FRONTEND = Target(TargetKey("dyn", "f:8000"), "dynamo-frontend", "dynamo", "m")
VLLM = Target(TargetKey("vllm", "v:8000"), "vllm-v1", "vllm", "m")


def _data(waiting: list[float], rate: list[float] | None, target: Target = FRONTEND) -> FleetData:
    d = FleetData(grid=np.arange(float(len(waiting))), targets={target.key: target})
    d.put(target.key, Signal.WAITING, np.array(waiting))
    if rate is not None:
        d.put(target.key, Signal.REQUEST_RATE, np.array(rate))
    return d


def test_the_part_a_within_slo_prefill_cannot_hold_is_the_queue() -> None:
    # m = rate x 2 s; held = max(1, m + 2 sqrt(m)): 1/s -> 2 + 2.83, 12/s -> 24 + 9.80, 0.1/s -> 1
    d = _data([50.0, 3.6, 30.0, 0.0], [1.0, 12.0, 12.0, 0.1])
    got = admission_queue(d, [FRONTEND], 2.0).series[FRONTEND.key][Signal.WAITING]
    want = [50 - (2 + 2 * math.sqrt(2)), 0.0, 0.0, 0.0]
    assert got == pytest.approx(want)


def test_hostile_rates_take_one_request_off_and_gaps_stay_gaps() -> None:
    """No counter, a gap, ±Inf or a negative rate: only the one request before its first token
    is taken off; a NaN queue sample stays a gap; integer input is fine; no warning."""
    d = _data([5, 5, 5, 5, 5], [math.nan, math.inf, -math.inf, -3.0, 0.0])
    with np.errstate(all="raise"):
        got = admission_queue(d, [FRONTEND], 2.0).series[FRONTEND.key][Signal.WAITING]
    assert got.tolist() == [4.0] * 5
    got = admission_queue(_data([math.nan, 9.0], None), [FRONTEND], 2.0).series[FRONTEND.key][Signal.WAITING]
    assert math.isnan(got[0]) and got[1] == 8.0


def test_other_engines_and_the_callers_data_are_left_alone() -> None:
    d = _data([50.0, 3.0], [1.0, 1.0], VLLM)
    assert admission_queue(d, [VLLM], 2.0) is d
    f = _data([50.0, 3.0], [1.0, 1.0])
    before = f.series[FRONTEND.key][Signal.WAITING].copy()
    out = admission_queue(f, [FRONTEND], 2.0)
    assert out is not f and (f.series[FRONTEND.key][Signal.WAITING] == before).all()
