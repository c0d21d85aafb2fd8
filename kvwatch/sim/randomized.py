"""Randomized scenarios: simulator parameters drawn from wide ranges, labelled by mechanism.

A *family* only decides what kind of traffic and policy to draw (steady load at a random
share of capacity, periodic waves, random bursts, a reservation policy, a wedged
scheduler, a slow engine, a long-prompt slice, an episode that ends, a ramp); the label
comes afterwards from the simulated ground truth (:mod:`kvwatch.sim.mechanism`), never
from the family and never from kvwatch's rule thresholds. Draws whose truth is ambiguous
are redrawn (their count is reported). Ranges: pool 40K-1.5M tokens, block size per
engine family, ``max_num_seqs`` 8-1024, prompt medians 100-4000 tokens (optionally a
bimodal long slice), outputs 40-800, prefix reuse 0-60 %, Poisson / periodic (square or
sine, period 2-10 min) / bursty / ramp arrivals.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvwatch.sim.calibrate import rate_for_usage, reserved_concurrency, throughput
from kvwatch.sim.corpus import default_end_time
from kvwatch.sim.engine import EngineConfig
from kvwatch.sim.fleet import DEFAULT_PORT, TargetRun, TargetSpec, seed_of, simulate
from kvwatch.sim.mechanism import Label, combine, label_trace
from kvwatch.sim.perturb import Variant, write_variants
from kvwatch.sim.scenarios import Replica, Segment
from kvwatch.sim.vocab import Dialect, Mode
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

Draw = tuple[tuple[Segment, ...], str]  # segments and a short description of the draw


def _logu(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def draw_engine(rng: np.random.Generator, engine: str) -> EngineConfig:
    """Pool, block size, limits and speed from wide ranges."""
    bs = {"vllm": int(rng.choice([16, 16, 32])), "sglang": 1}.get(engine) or int(rng.choice([32, 64, 128]))
    kv = _logu(rng, 40_000, 1_500_000)
    mml = int(rng.choice([8192, 16384, 32768]))
    mml = min(mml, int(kv // 2))
    return EngineConfig(
        num_blocks=int(kv // bs), block_size=bs, max_num_seqs=int(rng.choice([128, 256, 512, 1024])),
        max_model_len=mml, prefill_tokens_per_s=_logu(rng, 6000, 40_000),
        decode_step_s=float(rng.uniform(0.012, 0.06)), batch_knee=_logu(rng, 64, 512),
        client_timeout_s=float(rng.uniform(180, 900)),
        watermark_frac=float(rng.choice([0.0, 0.0, 0.01])),
        max_num_batched_tokens=int(rng.choice([2048, 4096, 8192, 16384])),
    )


def draw_workload(rng: np.random.Generator, cfg: EngineConfig, *, bimodal: float = 0.3) -> Workload:
    """Lengths: lognormal prompts (median 100-4000, p99 2-12x) and outputs (40-800), a long
    slice (1-15 % of 4K-30K-token prompts) with probability ``bimodal``."""
    pm = _logu(rng, 100, 4000)
    om = _logu(rng, 40, 800)
    prompt: LogNormal | Mixture = LogNormal(pm, pm * rng.uniform(2, 12))
    if rng.random() < bimodal:
        top = max(cfg.max_model_len - 2048, 4096)
        lo = min(rng.uniform(4000, 16000), top * 0.8)
        prompt = Mixture(((1 - (f := rng.uniform(0.01, 0.15)), prompt), (f, Uniform(lo, top))))
    return Workload(Steady(1.0), prompt, LogNormal(om, om * rng.uniform(2, 8)),
                    max_tokens=int(rng.choice([512, 1024, 2048, 4096])),
                    prefix_hit_frac=float(rng.uniform(0.0, 0.6)))


def _cap_rate(cfg: EngineConfig, wl: Workload) -> float:
    """Arrivals (req/s) that fill the pool, or the slots if they bind first."""
    kv = rate_for_usage(cfg, wl, 1.0)
    return min(kv, throughput(cfg, wl, cfg.max_num_seqs))


def _one(cfg: EngineConfig, wl: Workload, desc: str) -> Draw:
    return (Segment(0.0, cfg, wl),), desc


# ----------------------------------------------------------------------------- families
def steady(rng: np.random.Generator, cfg: EngineConfig, run_s: float) -> Draw:
    """Poisson arrivals at 0.3 %-250 % of what the pool holds (low, mid, over capacity)."""
    wl = draw_workload(rng, cfg)
    band = rng.random()
    rho = _logu(rng, 0.003, 0.15) if band < 0.35 else (rng.uniform(0.2, 0.9) if band < 0.65
                                                        else rng.uniform(1.15, 2.5))
    return _one(cfg, replace(wl, rate=Steady(rho * _cap_rate(cfg, wl))), f"steady rho={rho:.3f}")


def seq_capped(rng: np.random.Generator, cfg: EngineConfig, run_s: float) -> Draw:
    """A small max_num_seqs (2-48) binds before the pool: arrivals 1.2-3x its throughput."""
    cfg = replace(cfg, max_num_seqs=int(rng.choice([2, 4, 8, 12, 16, 24, 32, 48])))
    wl = draw_workload(rng, cfg, bimodal=0.1)
    lam = throughput(cfg, wl, cfg.max_num_seqs) * rng.uniform(1.2, 3.0)
    return _one(cfg, replace(wl, rate=Steady(lam)), f"max_num_seqs={cfg.max_num_seqs}")


def periodic(rng: np.random.Generator, cfg: EngineConfig, run_s: float) -> Draw:
    """Square or sine waves, period 2-10 min, peaks 0.5-2.5x capacity, troughs 0-30 %;
    a third of them with max_num_seqs capping the peaks before KV does."""
    wl = draw_workload(rng, cfg, bimodal=0.15)
    capped = rng.random() < 0.33
    if capped:
        cfg = replace(cfg, max_num_seqs=int(rng.choice([8, 16, 32, 64])))
    cap = _cap_rate(cfg, wl)
    period = rng.uniform(120, 600)
    hi = rng.uniform(0.5, 2.5)
    shape = Periodic(low=cap * rng.uniform(0.0, 0.3), high=cap * hi, period_s=period,
                     duty=float(rng.uniform(0.25, 0.6)), wave=str(rng.choice(["square", "sine"])),  # type: ignore[arg-type]
                     phase_s=float(rng.uniform(0, period)))
    return _one(cfg, replace(wl, rate=shape), f"periodic {period:.0f}s peak {hi:.2f}x{' seq-capped' if capped else ''}")


def bursty(rng: np.random.Generator, cfg: EngineConfig, run_s: float) -> Draw:
    """Busy noisy pool: random on/off bursts (base 40-75 %, peaks up to 0.95 of capacity) of
    requests with a heavy long-prompt slice, so usage jumps irregularly by large amounts."""
    cfg = replace(cfg, num_blocks=max(int(_logu(rng, 80_000, 300_000) // cfg.block_size),
                                      -(-cfg.max_model_len // cfg.block_size)), max_num_seqs=1024,
                  prefill_tokens_per_s=_logu(rng, 25_000, 40_000))
    wl = draw_workload(rng, cfg, bimodal=0.0)
    big = Uniform(4000, min(12_000, cfg.max_model_len - 2048))
    wl = replace(wl, prompt=Mixture(((1 - (f := rng.uniform(0.03, 0.12)), wl.prompt), (f, big))))
    cap = _cap_rate(cfg, wl)
    base, peak = rng.uniform(0.45, 0.7), rng.uniform(0.75, 0.9)
    shape = Bursty(base * cap, peak * cap, mean_on_s=float(rng.uniform(30, 240)),
                   mean_off_s=float(rng.uniform(60, 400)), seed=int(rng.integers(1 << 30)))
    return _one(cfg, replace(wl, rate=shape), f"bursty {base:.2f}-{peak:.2f}")


def reservation(rng: np.random.Generator, cfg: EngineConfig, run_s: float) -> Draw:
    """Reserve-for-max-output admission (optionally a 5-20 % watermark) at 0.5-2.5x the
    reserved throughput."""
    wl = draw_workload(rng, cfg, bimodal=0.1)
    wl = replace(wl, max_tokens=int(rng.choice([1024, 2048, 4096])))
    cfg = replace(cfg, reserve_max_output=bool(rng.random() < 0.8),
                  watermark_frac=float(rng.choice([0.0, 0.05, 0.1, 0.2])), max_num_seqs=1024)
    if not cfg.reserve_max_output:
        cfg = replace(cfg, watermark_frac=float(rng.uniform(0.3, 0.6)))
    n_res = reserved_concurrency(cfg, wl) if cfg.reserve_max_output else None
    lam = (throughput(cfg, wl, n_res) if n_res else rate_for_usage(cfg, wl, 1 - cfg.watermark_frac))
    rho = rng.uniform(0.5, 2.5)
    return _one(cfg, replace(wl, rate=Steady(lam * rho)), f"reservation rho={rho:.2f}")


def wedged(rng: np.random.Generator, cfg: EngineConfig, run_s: float) -> Draw:
    """Steady load (5-70 % of capacity); the scheduler wedges 8-25 min before the end."""
    wl = draw_workload(rng, cfg)
    wl = replace(wl, rate=Steady(rng.uniform(0.05, 0.7) * _cap_rate(cfg, wl)))
    at = run_s - rng.uniform(480, 1500)
    return (Segment(0.0, cfg, wl), Segment(at, replace(cfg, stalled=True), wl)), "wedged"


def slow_engine(rng: np.random.Generator, cfg: EngineConfig, run_s: float) -> Draw:
    """Compute-bound: prefill and decode 5-40x slower, long prompts, light arrivals."""
    cfg = replace(cfg, compute_factor=_logu(rng, 6, 25), max_num_seqs=1024)
    pm = _logu(rng, 2000, 6000)
    wl = Workload(Steady(1.0), LogNormal(pm, pm * rng.uniform(1.5, 3)),
                  LogNormal(rng.uniform(40, 150), 400), prefix_hit_frac=float(rng.uniform(0, 0.1)))
    prompt_tokens = pm * 1.2
    prate = cfg.prefill_tokens_per_s / cfg.compute_factor * cfg.max_prefill_share
    lam = rng.uniform(0.3, 0.6) * prate / prompt_tokens
    return _one(cfg, replace(wl, rate=Steady(lam)), f"slow x{cfg.compute_factor:.0f}")


def long_slice(rng: np.random.Generator, cfg: EngineConfig, run_s: float) -> Draw:
    """Mostly short prompts plus 0.5-5 % of 16K-30K ones in a large pool with slow-ish
    prefill: the slice owns the TTFT tail."""
    cfg = replace(cfg, num_blocks=max(cfg.num_blocks, int(_logu(rng, 600_000, 1_500_000) // cfg.block_size)),
                  max_model_len=32768, max_num_seqs=1024, prefill_tokens_per_s=_logu(rng, 6000, 12000))
    short = _logu(rng, 150, 900)
    frac = rng.uniform(0.005, 0.05)
    prompt = Mixture(((1 - frac, LogNormal(short, short * 3)), (frac, Uniform(16_000, 30_000))))
    wl = Workload(Steady(1.0), prompt, LogNormal(rng.uniform(80, 300), 1000), prefix_hit_frac=0.1)
    mean_prompt = (1 - frac) * short * 1.3 + frac * 23_000
    prate = cfg.prefill_tokens_per_s * cfg.max_prefill_share
    lam = rng.uniform(0.15, 0.35) * prate / mean_prompt
    return _one(cfg, replace(wl, rate=Steady(lam)), f"long slice {frac:.3f}")


def episode(rng: np.random.Generator, cfg: EngineConfig, run_s: float) -> Draw:
    """Healthy load, then a full or oscillating episode of 6-20 min that ends 3-20 min before
    the end (recovered pools, and pools still in the episode)."""
    wl = draw_workload(rng, cfg, bimodal=0.15)
    cap = _cap_rate(cfg, wl)
    base = Steady(rng.uniform(0.15, 0.6) * cap)
    length = rng.uniform(360, 1200)
    end = run_s - rng.uniform(180, 1200)
    start = max(end - length, 300.0)
    if rng.random() < 0.5:
        bad: Steady | Periodic = Steady(rng.uniform(1.4, 2.5) * cap)
        kind = "full"
    else:
        period = rng.uniform(120, 300)
        bad = Periodic(low=0.02 * cap, high=rng.uniform(1.3, 2.2) * cap, period_s=period, duty=0.4)
        kind = f"oscillating {period:.0f}s"
    shape = Piecewise(((start, base), (end, bad), (math.inf, base)))
    return _one(cfg, replace(wl, rate=shape), f"{kind} episode ends {run_s - end:.0f}s before the end")


def ramp(rng: np.random.Generator, cfg: EngineConfig, run_s: float) -> Draw:
    """Arrivals ramping (in 2-minute steps) between two shares of capacity (1 %-150 %)."""
    wl = draw_workload(rng, cfg)
    cap = _cap_rate(cfg, wl)
    a, b = _logu(rng, 0.01, 1.5), _logu(rng, 0.01, 1.5)
    steps = int(run_s // 120)
    phases = tuple(((k + 1) * 120.0, Steady(cap * (a + (b - a) * k / max(steps - 1, 1)))) for k in range(steps))
    return _one(cfg, replace(wl, rate=Piecewise((*phases, (math.inf, Steady(cap * b))))),
                f"ramp {a:.2f}->{b:.2f}")


FAMILIES: dict[str, tuple[float, Callable[[np.random.Generator, EngineConfig, float], Draw]]] = {
    "steady": (3.0, steady), "seq-capped": (1.0, seq_capped), "periodic": (2.0, periodic),
    "bursty": (1.5, bursty), "reservation": (1.0, reservation), "wedged": (0.8, wedged),
    "slow": (0.8, slow_engine), "long-slice": (1.0, long_slice), "episode": (1.5, episode),
    "ramp": (1.0, ramp),
}


#: engines without a family's mechanism, which are never drawn into it: vLLM admits on the
#: blocks a request needs now (V1 ``allocate_slots``; V0 keeps a 1 % watermark) and reserves
#: nothing for its output, so a reservation stall is not a vLLM state
FAMILY_ENGINES_WITHOUT: dict[str, tuple[str, ...]] = {"reservation": ("vllm",)}


@dataclass(frozen=True)
class DrawnTarget:
    """A simulated target with its mechanism label and how many draws were redrawn."""

    run: TargetRun
    label: Label
    family: str
    description: str
    redrawn: int


def _spec(name: str, family: str, dialect: Dialect, seed: int, segs: tuple[Segment, ...],
          label: Label | None, dp: int) -> TargetSpec:
    mode = label.mode if label and label.mode else Mode.HEALTHY
    replica = Replica(segs, mode, label.cause if label else None)
    return TargetSpec(name, family, dialect, seed, replica, f"kvwatch-rand/{family}-{seed}", data_parallel=dp)


def draw_target(index: int, seed: int, dialect: Dialect, *, family: str | None = None,
                duration_s: float = 2400.0, warmup_s: float = 300.0, end_time: float,
                scrape_interval_s: float = 15.0, max_redraws: int = 12) -> DrawnTarget:
    """Draw, simulate and label target ``index`` of corpus ``seed``; redraw ambiguous truth."""
    run_s = warmup_s + duration_s
    names = [n for n in FAMILIES if dialect.engine not in FAMILY_ENGINES_WITHOUT.get(n, ())]
    weights = np.array([FAMILIES[n][0] for n in names])
    for attempt in range(max_redraws + 1):
        rng = np.random.default_rng(seed_of(seed, index, attempt, "randomized"))
        fam = family or str(rng.choice(names, p=weights / weights.sum()))
        cfg = draw_engine(rng, dialect.engine)
        segs, desc = FAMILIES[fam][1](rng, cfg, run_s)
        dp = 2 if dialect is Dialect.VLLM_0_33 and rng.random() < 0.3 else 1
        name = f"rnd-{seed}-{index:03d}-{dialect.value}"
        spec = _spec(name, fam, dialect, seed * 1000 + index, segs, None, dp)
        run = simulate(spec, duration_s=duration_s, end_time=end_time, warmup_s=warmup_s,
                       scrape_interval_s=scrape_interval_s)
        label = combine([label_trace(tr) for tr in run.traces])
        if not label.ambiguous:
            spec = _spec(name, fam, dialect, seed * 1000 + index, segs, label, dp)
            return DrawnTarget(replace(run, spec=spec), label, fam, desc, attempt)
    raise RuntimeError(f"target {index} of seed {seed}: ambiguous after {max_redraws} redraws")


def _draw_job(job: tuple[int, int, str, float, float, float, float]) -> DrawnTarget:
    index, seed, dialect, duration_s, warmup_s, end_time, scrape_interval_s = job
    return draw_target(index, seed, Dialect(dialect), duration_s=duration_s, warmup_s=warmup_s,
                       end_time=end_time, scrape_interval_s=scrape_interval_s)


def draw_corpus(n: int, seed: int, *, dialects: Sequence[Dialect | str] | None = None,
                duration_s: float = 2400.0, warmup_s: float = 300.0, end_time: float,
                workers: int | None = None, scrape_interval_s: float = 15.0) -> list[DrawnTarget]:
    """``n`` targets of corpus ``seed``, dialects drawn uniformly (the same for a seed); the
    draws and their labels do not depend on ``scrape_interval_s`` (seconds), only the samples."""
    dials = [Dialect(d) for d in (dialects or list(Dialect))]
    rng = np.random.default_rng(seed_of(seed, "dialects"))
    jobs = [(i, seed, str(dials[int(rng.integers(len(dials)))]), duration_s, warmup_s, end_time,
             scrape_interval_s) for i in range(n)]
    workers = workers or min(2, os.cpu_count() or 1)
    if workers <= 1:
        return [_draw_job(j) for j in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_draw_job, jobs))


def manifest_entry(d: DrawnTarget, port: int = DEFAULT_PORT) -> dict[str, Any]:
    """What the scorer needs about one target: identity, label, mechanism and evidence."""
    spec = d.run.spec
    ev = d.label.evidence
    return {
        "instance": spec.instance(port), "dialect": spec.dialect.value, "family": d.family,
        "draw": d.description, "expected": d.label.mode.value if d.label.mode else None,
        "cause": d.label.cause.value if d.label.cause else None, "mechanism": d.label.mechanism,
        "persistent_queue": ev.get("wait", 0.0) >= 0.5, "redrawn": d.redrawn,
        "without_tail": d.label.without_tail,
        "data_parallel": spec.data_parallel,
        "evidence": {k: round(v, 4) for k, v in ev.items()},
    }


def build(out_dir: str | Path, *, n: int, seeds: Sequence[int], variants: Sequence[Variant],
          dialects: Sequence[Dialect | str] | None = None, end_time: float | None = None,
          job: str = "rnd", port: int = DEFAULT_PORT, workers: int | None = None,
          share: float = 1.0, scrape_interval_s: float = 15.0) -> dict[str, Any]:
    """Draw ``n`` targets per seed, write the base and (for a seeded ``share`` of the
    targets) every perturbed variant into ``out_dir/fleet.om`` and the labels into
    ``out_dir/manifest.json``; returns the manifest. ``scrape_interval_s`` is the base
    variant's scrape interval (a variant's ``every`` keeps every n-th of those scrapes)."""
    end_time = default_end_time() if end_time is None else float(end_time)
    drawn = [d for s in seeds for d in draw_corpus(n, s, dialects=dialects, end_time=end_time,
                                                    workers=workers, scrape_interval_s=scrape_interval_s)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = write_variants([d.run for d in drawn], variants, out / "fleet.om", job=job, port=port,
                             share=share)
    doc = {
        "schema": "kvwatch.sim/randomized-v1", "end_unix": end_time, "job": job,
        "seeds": list(seeds), "share": share, "scrape_interval_s": scrape_interval_s,
        "variants": [{**asdict(v), "job": f"{job}-{v.name}", "instances": written[v.name]} for v in variants],
        "targets": [manifest_entry(d, port) for d in drawn],
    }
    (out / "manifest.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return doc
