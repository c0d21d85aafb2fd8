"""Mechanistic properties of the simulated engine (no Prometheus involved)."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np
import pytest

from kvwatch.sim.buckets import HistBank, select
from kvwatch.sim.engine import Engine, EngineConfig
from kvwatch.sim.fleet import make_targets
from kvwatch.sim.requests import DECODE
from kvwatch.sim.trace import Recorder, Trace
from kvwatch.sim.workload import (
    Bursty,
    LogNormal,
    Mixture,
    Periodic,
    Piecewise,
    Steady,
    Uniform,
    Workload,
)

CHAT = Workload(Steady(1.0), LogNormal(1000, 6000), LogNormal(250, 1200))


def run(cfg: EngineConfig, rate: float, steps: int, wl: Workload = CHAT, seed: int = 1,
        restart_at: int | None = None) -> tuple[Engine, Trace]:
    rec = Recorder()
    eng = Engine(cfg, replace(wl, rate=Steady(rate)), seed=seed, recorder=rec)
    for i in range(steps):
        if i == restart_at:
            eng.restart()
        eng.step()
        if i % 15 == 14:
            rec.snapshot_hist(eng.hist)
    return eng, rec.trace(eng.cfg, eng.hist)


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_blocks_are_exact_and_usage_never_exceeds_one(block_size: int) -> None:
    cfg = EngineConfig(num_blocks=150_000 // block_size, block_size=block_size)
    eng = Engine(cfg, replace(CHAT, rate=Periodic(0.2, 12.0, 300, 0.5)), seed=3)
    saw_full = False
    for _ in range(900):
        eng.step()
        brute = sum(math.ceil((r.x + eng._clock) / block_size) if r.state == DECODE
                    else r.blocks for r in eng.running.values())
        used, usage = eng.g[2], eng.g[0]
        assert brute == used, "incremental block accounting drifted"
        assert 0.0 <= usage <= 1.0
        assert len(eng.running) <= cfg.max_num_seqs
        saw_full |= usage > 0.97
    assert saw_full, "the periodic overload should reach the ceiling at least once"


def test_preemptions_only_when_blocks_run_out() -> None:
    cfg = EngineConfig(num_blocks=12_000, block_size=16)
    _, light = run(cfg, rate=1.0, steps=900)
    assert light.counter("preemptions")[-1] == 0
    _, heavy = run(cfg, rate=12.0, steps=900)
    pre = np.diff(heavy.counter("preemptions"), prepend=0.0)
    assert pre.sum() > 0
    # every preemption happens while the pool is (almost) full: one request's blocks at most
    assert heavy.gauge("usage")[pre > 0].min() >= 0.9


def test_max_num_seqs_is_a_hard_cap_and_limits_an_idle_pool() -> None:
    cfg = EngineConfig(num_blocks=20_000, block_size=16, max_num_seqs=4)
    _, tr = run(cfg, rate=3.0, steps=600)
    running, waiting = tr.gauge("running"), tr.gauge("waiting")
    assert running.max() == 4
    assert (running[300:] == 4).mean() > 0.95
    assert waiting[-1] > 100 and tr.gauge("usage").max() < 0.15


def test_a_running_gauge_read_after_the_step_misses_the_requests_that_just_finished() -> None:
    """vLLM reads num_requests_running after a step's finished requests left and before the next
    step refills their slots: a batch held at max_num_seqs=512 (about 100-token outputs, a queue
    of thousands) is at the cap in every step, yet shown below it after the steps in which
    requests finish; a batch that is not refilled (nobody waits) shows what runs."""
    cfg = EngineConfig(num_blocks=100_000, block_size=16, max_num_seqs=512)
    wl = Workload(Steady(1.0), LogNormal(50, 25), LogNormal(100, 50))
    _, tr = run(cfg, rate=150.0, steps=400, wl=wl)
    running, shown = tr.gauge("running")[200:], tr.gauge("running_shown")[200:]
    assert (running == 512).all() and (shown <= running).all()
    assert (shown < 512).mean() > 0.1 and (running - shown).mean() > 1, (running - shown).mean()
    _, quiet = run(cfg, rate=2.0, steps=300, wl=wl)  # nobody waits: no refill to miss
    assert (quiet.gauge("running_shown") == quiet.gauge("running")).all()


def test_reserve_for_max_output_lowers_admitted_concurrency() -> None:
    cfg = EngineConfig(num_blocks=12_000, block_size=16, prefill_tokens_per_s=100_000)
    wl = replace(CHAT, output=LogNormal(150, 600), max_tokens=3072)
    _, plain = run(cfg, rate=12.0, steps=900, wl=wl)
    _, reserve = run(replace(cfg, reserve_max_output=True), rate=12.0, steps=900, wl=wl)
    tail = slice(300, None)
    assert plain.gauge("waiting")[tail].mean() < 1  # the pool absorbs this rate ...
    assert reserve.gauge("running")[tail].mean() < 0.6 * plain.gauge("running")[tail].mean()
    assert reserve.gauge("waiting")[tail].mean() > 10
    assert reserve.gauge("usage")[tail].max() < 0.75  # reported usage low while requests wait
    assert reserve.counter("preemptions")[-1] == 0  # reservations never need preemption
    assert (reserve.gauge("alloc_frac") <= 1.0).all()


def test_counters_are_monotonic_except_across_a_restart() -> None:
    cfg = EngineConfig(num_blocks=12_000, block_size=16)
    _, tr = run(cfg, rate=10.0, steps=600, restart_at=400)
    for name in ("prompt_tokens", "generation_tokens", "success_stop", "preemptions",
                 "prefix_queries", "prefix_hits"):
        drops = np.flatnonzero(np.diff(tr.counter(name)) < 0)
        assert set(drops.tolist()) <= {399}, name
    assert tr.counter("generation_tokens")[400] < tr.counter("generation_tokens")[399]
    assert tr.gauge("running")[399] > 0


def test_stalled_scheduler_queues_without_progress_and_times_out() -> None:
    cfg = EngineConfig(num_blocks=12_000, block_size=16, client_timeout_s=60)
    eng, tr = run(cfg, rate=2.0, steps=120)
    eng.reconfigure(replace(cfg, stalled=True))
    before = eng.c[:]
    eng.run(200)
    names = tr.counters.shape[1]
    assert names and eng.g[4] == 0  # nothing running: frozen requests timed out
    assert eng.g[5] > 50  # queue keeps growing up to the client timeout
    gen = 2  # generation_tokens
    assert eng.c[gen] == before[gen]
    assert eng.c[7] > before[7]  # aborted


def test_compute_bound_knob_raises_ttft_without_queue() -> None:
    cfg = EngineConfig(num_blocks=40_000, block_size=16)
    wl = replace(CHAT, prompt=LogNormal(4000, 6000))
    _, fast = run(cfg, rate=0.2, steps=900, wl=wl)
    _, slow = run(replace(cfg, compute_factor=10.0), rate=0.2, steps=900, wl=wl)
    assert np.median(slow.ttft) > 5 * np.median(fast.ttft)
    assert np.median(slow.ttft) > 1.5
    assert (slow.gauge("waiting") > 0).mean() < 0.05


def test_histograms_are_cumulative_and_count_every_first_token() -> None:
    cfg = EngineConfig(num_blocks=12_000, block_size=16)
    eng, tr = run(cfg, rate=3.0, steps=600)
    cum, count, total = select(eng.hist, "ttft", eng.hist.state(), (0.1, 0.5, 1.0, 5.0))
    values = [float(x) for x in cum]
    assert values == sorted(values) and values[-1] == float(count) == len(tr.ttft)
    assert float(total) == pytest.approx(tr.ttft.sum())
    bank = HistBank()
    bank.pending[0].extend([0.1, 0.1000001, 3.0])
    cum, _, _ = select(bank, "ttft", bank.state(), (0.1, 2.5))
    assert [float(x) for x in cum] == [1.0, 2.0, 3.0]  # le is inclusive


def test_rate_shapes_and_length_distributions() -> None:
    wave = Periodic(1.0, 9.0, period_s=100, duty=0.3)
    assert wave(10) == 9.0 and wave(50) == 1.0 and wave(110) == 9.0
    sine = Periodic(0.0, 2.0, period_s=100, wave="sine")
    assert sine(25) == pytest.approx(2.0) and sine(75) == pytest.approx(0.0)
    phases = Piecewise(((60, Steady(1.0)), (120, Steady(5.0)), (math.inf, Steady(2.0))))
    assert (phases(10), phases(90), phases(500)) == (1.0, 5.0, 2.0)
    bursty = Bursty(1.0, 10.0, mean_on_s=30, mean_off_s=90, seed=4)
    on = np.mean([bursty(t) == 10.0 for t in range(0, 20_000, 7)])
    assert 0.15 < on < 0.35
    rng = np.random.default_rng(0)
    x = LogNormal(500, 4000).sample(rng, 100_000)
    assert np.median(x) == pytest.approx(500, rel=0.05)
    assert np.quantile(x, 0.99) == pytest.approx(4000, rel=0.1)
    mix = Mixture(((0.95, LogNormal(400, 1200)), (0.05, Uniform(30_000, 32_000)))).sample(rng, 50_000)
    assert (mix >= 30_000).mean() == pytest.approx(0.05, abs=0.01)


def test_one_target_hour_is_fast() -> None:
    """60 simulated minutes of a busy target (about 8 requests/s) in well under a second."""
    spec = make_targets("healthy-busy", "vllm-0.33", 0, run_s=3600)[0]
    seg = spec.replica.segments[0]
    best = math.inf
    for _ in range(2):
        eng = Engine(seg.config, seg.workload, seed=0, recorder=Recorder())
        start = time.process_time()
        eng.run(3600)
        best = min(best, time.process_time() - start)
    print(f"healthy-busy: 3600 steps in {best:.3f}s CPU")
    assert best < 2.0  # typically 0.3-0.6 s on the 2-core CI machine; generous for noise
