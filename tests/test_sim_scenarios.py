"""Scenario presets show their labelled mode in the simulator's ground truth, over seeds."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvwatch.sim.fleet import TargetSpec, make_targets, simulate
from kvwatch.sim.scenarios import PRESETS, BuildContext, sample_base, schedule
from kvwatch.sim.validate import validate, validate_group
from kvwatch.sim.vocab import Dialect, Mode
from kvwatch.sim.workload import Steady

DURATION, WARMUP, END = 2100.0, 300.0, 1_790_000_000.0
# two seeds per preset, on engines with different KV block sizes (16; 1 or 32/64)
CASES = [(p, seed, dialect) for i, p in enumerate(PRESETS)
         for seed, dialect in ((100 + i, "vllm-0.10"),
                               (200 + i, "sglang-0.5" if i % 2 else "trtllm-serve"))]


def run(spec: TargetSpec) -> object:
    return simulate(spec, duration_s=DURATION, end_time=END, warmup_s=WARMUP)


@pytest.mark.parametrize(("preset", "seed", "dialect"), CASES,
                         ids=[f"{p}-{d}-{s}" for p, s, d in CASES])
def test_preset_shows_its_mode_in_ground_truth(preset: str, seed: int, dialect: str) -> None:
    specs = make_targets(preset, dialect, seed, run_s=DURATION + WARMUP)
    results = [validate(run(s)) for s in specs]
    for v in results:
        assert v.ok, (v.name, v.expected, v.cause, v.verdicts, v.stats)
    if len(specs) > 1:
        assert specs[0].group_expected is Mode.MISREAD and validate_group(results)


def test_a_mislabelled_case_is_rejected() -> None:
    """A "full" preset at a rate the pool absorbs is healthy, and validation says so."""
    spec = make_targets("full", Dialect.VLLM_0_33, 5, run_s=DURATION + WARMUP)[0]
    seg = spec.replica.segments[0]
    calm = replace(seg.workload, rate=Steady(seg.workload.rate(0) / 4))
    bad = replace(spec, replica=replace(spec.replica, segments=(replace(seg, workload=calm),)))
    v = validate(run(bad))
    assert not v.ok and v.verdicts[0].mode is Mode.HEALTHY


def test_phase_schedules_take_the_last_phases_label() -> None:
    rng = np.random.default_rng(9)
    ctx = BuildContext(sample_base(rng, "vllm"), rng, DURATION + WARMUP)
    replica = schedule([("healthy-light", 600.0), ("full", None)], ctx)
    assert replica.expected is Mode.FULL and len(replica.segments) == 2
    spec = make_targets("healthy-light", Dialect.VLLM_0_33, 9, run_s=None)[0]
    v = validate(run(replace(spec, replica=replica)))
    assert v.ok, (v.verdicts, v.stats)
    with pytest.raises(ValueError, match="several replicas"):
        schedule([("misread-imbalance", None)], ctx)


def test_seeds_vary_capacity_and_rates_deterministically() -> None:
    def fingerprint(seed: int) -> tuple[float, float, int]:
        seg = make_targets("oscillating", "vllm-0.33", seed, run_s=3000)[0].replica.segments[0]
        return seg.config.num_blocks, seg.workload.rate.period_s, seg.config.max_num_seqs

    prints = {fingerprint(s) for s in range(5)}
    assert len(prints) == 5
    assert fingerprint(3) == fingerprint(3)
