"""Named scenario presets, each labelled with the failure mode it must show.

A preset builds, from a seeded RNG and a base engine (pool geometry fixed by the dialect's
engine family), one or more replicas; each replica is a schedule of segments (engine
config + workload from a start time). Capacities, rates, lengths and periods vary by seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from kvwatch.sim.calibrate import (
    concurrency_for_usage,
    pool_for_usage,
    rate_for_usage,
    reserved_concurrency,
    sample_lengths,
    throughput,
)
from kvwatch.sim.engine import EngineConfig
from kvwatch.sim.vocab import IdleCause, Mode
from kvwatch.sim.workload import LogNormal, Mixture, Periodic, Piecewise, Steady, Uniform, Workload


@dataclass(frozen=True)
class Segment:
    """From ``start_s`` (relative to the start of the run) the engine runs this."""

    start_s: float
    config: EngineConfig
    workload: Workload


@dataclass(frozen=True)
class Replica:
    """One engine instance of a preset and the mode it is expected to show."""

    segments: tuple[Segment, ...]
    expected: Mode
    cause: IdleCause | None = None


@dataclass(frozen=True)
class BuildContext:
    """Inputs of a preset builder; ``duration_s`` is None for open-ended (live) runs."""

    base: EngineConfig
    rng: np.random.Generator
    duration_s: float | None = None


@dataclass(frozen=True)
class Preset:
    name: str
    expected: Mode
    cause: IdleCause | None
    description: str
    build: Callable[[BuildContext], tuple[Replica, ...]]


def sample_base(rng: np.random.Generator, engine: str) -> EngineConfig:
    """A seeded engine: pool 160K-400K tokens, block size of the engine family, decode
    iteration 25-45 ms (a 13B-70B-class model)."""
    block_size = {"vllm": 16, "sglang": 1}.get(engine) or int(rng.choice([32, 64]))
    kv_tokens = math.exp(rng.uniform(math.log(160_000), math.log(400_000)))
    return EngineConfig(
        num_blocks=int(kv_tokens // block_size), block_size=block_size,
        prefill_tokens_per_s=float(rng.uniform(14_000, 30_000)),
        decode_step_s=float(rng.uniform(0.025, 0.045)), batch_knee=float(rng.uniform(96, 192)),
        client_timeout_s=float(rng.uniform(300, 600)),
    )


def chat(rng: np.random.Generator, spread: tuple[float, float] = (4.0, 8.0)) -> Workload:
    """Chat-like traffic: lognormal prompts (median 600-2000, p99 ``spread`` x median) and
    outputs (median 200-500); the rate is set by the preset."""
    pm, om = rng.uniform(600, 2000), rng.uniform(200, 500)
    lo, hi = spread
    return Workload(Steady(1.0), LogNormal(pm, pm * rng.uniform(lo, hi)),
                    LogNormal(om, om * rng.uniform(lo, hi) * 0.7),
                    max_tokens=int(rng.choice([2048, 4096])),
                    prefix_hit_frac=float(rng.uniform(0.1, 0.4)))


_CALM = (2.0, 3.0)  # light tails: a busy pool stays clear of its ceiling


def _seqs(cfg: EngineConfig, wl: Workload, usage: float) -> EngineConfig:
    """Raise max_num_seqs (256/512/1024) so that a pool ``usage`` full is not seq-capped."""
    need = 1.4 * concurrency_for_usage(cfg, wl, usage)
    cap = next((c for c in (256, 512, 1024) if c >= need), 1024)
    return replace(cfg, max_num_seqs=max(cfg.max_num_seqs, cap))


def _one(cfg: EngineConfig, wl: Workload, mode: Mode, cause: IdleCause | None = None
         ) -> tuple[Replica, ...]:
    return (Replica((Segment(0.0, cfg, wl),), mode, cause),)


def _prefill_headroom(cfg: EngineConfig, wl: Workload, rate: float,
                      utilisation: float = 0.4) -> EngineConfig:
    """Speed prefill up so that ``rate`` req/s keep it at most ``utilisation`` busy."""
    prompt, _ = sample_lengths(cfg, wl)
    demand = rate * float(prompt.mean()) * (1.0 - wl.prefix_hit_frac)  # tokens/s
    capacity = cfg.prefill_tokens_per_s / cfg.compute_factor * cfg.max_prefill_share
    if demand <= utilisation * capacity:
        return cfg
    return replace(cfg, prefill_tokens_per_s=cfg.prefill_tokens_per_s * demand
                   / (utilisation * capacity))


def _steady(ctx: BuildContext, usage: float, wl: Workload | None = None) -> tuple[EngineConfig,
                                                                                   Workload]:
    """Steady traffic filling ``min(usage, 1)`` of the pool (rate at ``usage`` capacity)."""
    wl = wl or chat(ctx.rng)
    cfg = _seqs(ctx.base, wl, min(usage, 1.0))
    cfg = _prefill_headroom(cfg, wl, rate_for_usage(cfg, wl, min(usage, 1.0)))
    return cfg, replace(wl, rate=Steady(rate_for_usage(cfg, wl, usage)))


def healthy_busy(ctx: BuildContext) -> tuple[Replica, ...]:
    # compute headroom (a flat decode-time curve) keeps a busy pool stable
    ctx = replace(ctx, base=replace(ctx.base, batch_knee=float(ctx.rng.uniform(384, 768))))
    return _one(*_steady(ctx, ctx.rng.uniform(0.68, 0.76), chat(ctx.rng, _CALM)), Mode.HEALTHY)


def healthy_light(ctx: BuildContext) -> tuple[Replica, ...]:
    return _one(*_steady(ctx, ctx.rng.uniform(0.25, 0.45), chat(ctx.rng, (3.0, 5.0))),
                Mode.HEALTHY)


def healthy_burst_ended(ctx: BuildContext) -> tuple[Replica, ...]:
    rng = ctx.rng
    cfg, wl = _steady(ctx, rng.uniform(0.3, 0.45), chat(rng, _CALM))
    base = wl.rate
    burst = Steady(rng.uniform(1.3, 1.6) * rate_for_usage(cfg, wl, 1.0))
    length = rng.uniform(180, 300)
    end = (ctx.duration_s - rng.uniform(22, 26) * 60) if ctx.duration_s else length
    start = max(end - length, 0.0)
    shape = Piecewise(((start, base), (end, burst), (math.inf, base)))
    return _one(cfg, replace(wl, rate=shape), Mode.HEALTHY)


def full(ctx: BuildContext) -> tuple[Replica, ...]:
    cfg, wl = _steady(ctx, 1.0)
    return _one(cfg, replace(wl, rate=Steady(wl.rate(0) * ctx.rng.uniform(1.5, 2.5))), Mode.FULL)


def full_long_context(ctx: BuildContext) -> tuple[Replica, ...]:
    rng = ctx.rng
    wl = chat(rng)
    wl = replace(wl, prompt=Mixture(((0.8, wl.prompt), (0.2, Uniform(8000, 30000)))))
    cfg, wl = _steady(ctx, 1.0, wl)
    return _one(cfg, replace(wl, rate=Steady(wl.rate(0) * rng.uniform(1.3, 2.0))), Mode.FULL)


def idle_low_demand(ctx: BuildContext) -> tuple[Replica, ...]:
    return _one(*_steady(ctx, ctx.rng.uniform(0.01, 0.05)), Mode.IDLE, IdleCause.LOW_DEMAND)


def idle_batch_limited(ctx: BuildContext) -> tuple[Replica, ...]:
    rng = ctx.rng
    cfg = replace(ctx.base, max_num_seqs=int(rng.choice([2, 4, 6, 8])))
    wl = chat(rng)
    rate = throughput(cfg, wl, cfg.max_num_seqs) * rng.uniform(1.5, 3.0)
    return _one(cfg, replace(wl, rate=Steady(rate)), Mode.IDLE, IdleCause.BATCH_LIMITED)


def idle_stalled(ctx: BuildContext) -> tuple[Replica, ...]:
    rng = ctx.rng
    cfg, wl = _steady(ctx, rng.uniform(0.2, 0.4))
    cfg = replace(cfg, client_timeout_s=float(rng.uniform(120, 300)))
    wedged = replace(cfg, stalled=True)
    segments = (Segment(0.0, cfg, wl), Segment(float(rng.uniform(60, 240)), wedged, wl))
    return (Replica(segments, Mode.IDLE, IdleCause.STALLED),)


def _paced_by_prefill(ctx: BuildContext, wl: Workload, prefill_tokens_per_s: float,
                      utilisation: float, usage: float, *, slow_decode: bool
                      ) -> tuple[EngineConfig, Workload]:
    """Arrivals keeping ``utilisation`` of the prefill capacity busy (prefill may use
    ``max_prefill_share`` of a step while decoding); a pool that they fill to ``usage``.

    ``slow_decode`` slows decoding by the same factor (compute-bound engine); otherwise only
    the prefill speed changes.
    """
    base = ctx.base
    if slow_decode:
        cfg = replace(base, compute_factor=base.prefill_tokens_per_s / prefill_tokens_per_s)
    else:
        cfg = replace(base, prefill_tokens_per_s=prefill_tokens_per_s)
    prompt, _ = sample_lengths(cfg, wl)
    computed = float(prompt.mean()) * (1.0 - wl.prefix_hit_frac)
    rate = utilisation * prefill_tokens_per_s * cfg.max_prefill_share / computed
    cfg = replace(cfg, num_blocks=pool_for_usage(cfg, wl, rate, usage))
    return cfg, replace(wl, rate=Steady(rate))


def idle_compute_bound(ctx: BuildContext) -> tuple[Replica, ...]:
    rng = ctx.rng
    pm = rng.uniform(4000, 7000)
    wl = Workload(Steady(1.0), LogNormal(pm, pm * 1.5), LogNormal(rng.uniform(60, 120), 400),
                  prefix_hit_frac=0.05)
    cfg, wl = _paced_by_prefill(ctx, wl, rng.uniform(1500, 2200), rng.uniform(0.3, 0.45),
                                rng.uniform(0.03, 0.06), slow_decode=True)
    return _one(cfg, wl, Mode.IDLE, IdleCause.COMPUTE_BOUND)


def fragmented(ctx: BuildContext) -> tuple[Replica, ...]:
    rng = ctx.rng
    pm, om = rng.uniform(800, 1500), rng.uniform(100, 200)
    wl = Workload(Steady(1.0), LogNormal(pm, pm * 4), LogNormal(om, om * 4),
                  max_tokens=int(rng.uniform(1536, 3072)), prefix_hit_frac=0.2)
    cfg = replace(ctx.base, reserve_max_output=True,
                  watermark_frac=float(rng.choice([0.0, 0.05, 0.1])))
    n_res = reserved_concurrency(cfg, wl)
    cfg = replace(cfg, max_num_seqs=max(256, int(2 * n_res)))
    rate = throughput(cfg, wl, n_res) * rng.uniform(1.4, 2.2)
    return _one(cfg, replace(wl, rate=Steady(rate)), Mode.FRAGMENTED)


def oscillating(ctx: BuildContext) -> tuple[Replica, ...]:
    rng = ctx.rng
    cfg, wl = _steady(ctx, 1.0)
    cap = wl.rate(0)
    period = rng.uniform(180, 480)
    shape = Periodic(low=0.03 * cap, high=rng.uniform(1.5, 2.0) * cap, period_s=period,
                     duty=rng.uniform(0.3, 0.45), phase_s=rng.uniform(0, period))
    return _one(cfg, replace(wl, rate=shape), Mode.OSCILLATING)


def misread_tail(ctx: BuildContext) -> tuple[Replica, ...]:
    """Mostly short prompts plus 3-6 % of 24K-32K ones in a large pool.

    The long prompts own the TTFT p99 (seconds of prefill) while the mean stays low, and
    the pool is large enough that they cause no queue, preemption or usage swing. They must
    stay well above 1 % of every latency window's requests: at 1.5 % (~18 of ~1,200 requests
    in 10 minutes) Poisson noise drops them below the 1 % the p99 needs for minutes at a
    time, the p99 falls back to the short prompts and the scenario stops showing its mode.
    """
    rng = ctx.rng
    short, long_frac = rng.uniform(300, 800), rng.uniform(0.03, 0.06)
    prompt = Mixture(((1.0 - long_frac, LogNormal(short, short * 3)),
                      (long_frac, Uniform(24_000, 32_000))))
    wl = Workload(Steady(1.0), prompt, LogNormal(rng.uniform(150, 300), 1000),
                  prefix_hit_frac=0.1)
    cfg, wl = _paced_by_prefill(ctx, wl, rng.uniform(8000, 12_000), rng.uniform(0.25, 0.35),
                                rng.uniform(0.2, 0.3), slow_decode=False)
    cfg = replace(cfg, num_blocks=max(cfg.num_blocks, 400_000 // cfg.block_size))
    return _one(_seqs(cfg, wl, 0.5), wl, Mode.MISREAD)


def misread_imbalance(ctx: BuildContext) -> tuple[Replica, ...]:
    rng = ctx.rng
    wl = chat(rng, _CALM)
    replicas = []
    for i in range(int(rng.integers(3, 6))):
        if i == 0:  # the load balancer sends this one far more than it can hold
            cfg, w = _steady(ctx, 1.0, wl)
            w = replace(w, rate=Steady(w.rate(0) * rng.uniform(1.4, 2.0)))
            replicas.append(Replica((Segment(0.0, cfg, w),), Mode.FULL))
        else:  # the others half loaded at most, so the group's mean looks fine beyond doubt: at
            # 0.55 a three-replica group averaged 0.71 with the saturated one (demo seed 91), 40
            # points over the others only just (seed 95), where the rule's 0.7 / 0.4 decide by the draw
            cfg, w = _steady(ctx, rng.uniform(0.3, 0.5), wl)
            replicas.append(Replica((Segment(0.0, cfg, w),), Mode.HEALTHY))
    return tuple(replicas)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("healthy-busy", Mode.HEALTHY, None, "pool 70-80 % used, no queue", healthy_busy),
    Preset("healthy-light", Mode.HEALTHY, None, "pool 25-45 % used", healthy_light),
    Preset("healthy-burst-ended", Mode.HEALTHY, None,
           "a full-like burst that ended 22-27 min before the end", healthy_burst_ended),
    Preset("full", Mode.FULL, None, "demand 1.5-2.5x KV capacity", full),
    Preset("full-long-context", Mode.FULL, None, "20 % 8K-30K prompts beyond capacity",
           full_long_context),
    Preset("idle-low-demand", Mode.IDLE, IdleCause.LOW_DEMAND, "pool 1-5 % used",
           idle_low_demand),
    Preset("idle-batch-limited", Mode.IDLE, IdleCause.BATCH_LIMITED,
           "max_num_seqs 2-8, queue grows", idle_batch_limited),
    Preset("idle-stalled", Mode.IDLE, IdleCause.STALLED, "scheduler wedged after 1-4 min",
           idle_stalled),
    Preset("idle-compute-bound", Mode.IDLE, IdleCause.COMPUTE_BOUND,
           "slow prefill: high TTFT, no queue, low usage", idle_compute_bound),
    Preset("fragmented", Mode.FRAGMENTED, None,
           "reserve-for-max-output admission: low usage while requests wait", fragmented),
    Preset("oscillating", Mode.OSCILLATING, None, "square-wave traffic, period 3-8 min",
           oscillating),
    Preset("misread-tail", Mode.MISREAD, None,
           "3-6 % 24K-32K prompts: fine mean TTFT, p99 >= 10x p50", misread_tail),
    Preset("misread-imbalance", Mode.MISREAD, None,
           "3-5 replicas of one model, one saturated (1.4-2x), the others 30-50 % loaded", misread_imbalance),
)}


def schedule(phases: Sequence[tuple[str, float | None]], ctx: BuildContext) -> Replica:
    """Chain single-replica presets: ``[("healthy-busy", 180), ("full", 300), ...]``.

    Durations are seconds (None: until the end). The expected mode is the last phase's.
    """
    segments: list[Segment] = []
    start = 0.0
    last = None
    for name, duration in phases:
        preset = PRESETS[name]
        sub = replace(ctx, duration_s=duration)
        (replica, *rest) = preset.build(sub)
        if rest:
            raise ValueError(f"preset {name!r} has several replicas; it cannot be a phase")
        segments.extend(replace(s, start_s=start + s.start_s) for s in replica.segments)
        last = replica
        start += duration or 0.0
    if last is None:
        raise ValueError("empty schedule")
    return Replica(tuple(segments), last.expected, last.cause)
