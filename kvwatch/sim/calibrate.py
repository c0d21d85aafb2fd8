"""Little's-law capacity estimates used to set preset rates (req/s) and pool sizes (blocks).

Estimates only: presets are checked against the simulated ground truth by ``validate``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from kvwatch.sim.engine import EngineConfig
from kvwatch.sim.workload import Steady, Workload


@lru_cache(maxsize=256)
def _sample(wl: Workload, max_model_len: int) -> tuple[np.ndarray, np.ndarray]:
    return wl.means(max_model_len, n=8000)


def sample_lengths(cfg: EngineConfig, wl: Workload) -> tuple[np.ndarray, np.ndarray]:
    """A fixed (cached) sample of prompt and output lengths; the rate is irrelevant."""
    return _sample(replace(wl, rate=Steady(1.0)), cfg.max_model_len)


def _life_s(cfg: EngineConfig, wl: Workload, concurrency: float, lam: float) -> float:
    """Mean time a request holds KV at ``concurrency`` running and ``lam`` arrivals/s.

    Decoding slows with the batch and with the share of each step spent on prefill;
    prefill itself is processor-shared (sojourn = service / (1 - utilisation)).
    """
    prompt, out = sample_lengths(cfg, wl)
    prate = cfg.prefill_tokens_per_s / cfg.compute_factor
    computed = float(prompt.mean()) * (1.0 - min(wl.prefix_hit_frac, 0.45))
    step_s = cfg.decode_step_s * cfg.compute_factor * (1.0 + concurrency / cfg.batch_knee)
    share = min(lam * computed / prate, cfg.max_prefill_share)
    busy = min(lam * computed / (prate * cfg.max_prefill_share), 0.9)
    return float(out.mean()) * step_s / (1.0 - share) + computed / prate / (1.0 - busy)


def throughput(cfg: EngineConfig, wl: Workload, concurrency: float) -> float:
    """Arrival rate (req/s) that keeps ``concurrency`` requests running in steady state."""
    lam = concurrency / _life_s(cfg, wl, concurrency, 0.0)
    for _ in range(30):  # prefill steals decode time: fixed point on the prefill share
        lam = 0.5 * lam + 0.5 * concurrency / _life_s(cfg, wl, concurrency, lam)
    return lam


def concurrency_at(cfg: EngineConfig, wl: Workload, lam: float) -> float:
    """Running requests in steady state at ``lam`` arrivals/s (below saturation)."""
    n = lam * _life_s(cfg, wl, 0.0, lam)
    for _ in range(30):
        n = 0.5 * n + 0.5 * lam * _life_s(cfg, wl, n, lam)
    return n


def blocks_per_request(cfg: EngineConfig, wl: Workload) -> float:
    """Time-weighted KV blocks held by one running request (context grows while decoding)."""
    prompt, out = sample_lengths(cfg, wl)
    return float((out * (prompt + out / 2)).sum() / out.sum()) / cfg.block_size + 0.5


def concurrency_for_usage(cfg: EngineConfig, wl: Workload, usage: float) -> float:
    """Running requests whose KV fills ``usage`` of the pool."""
    return usage * cfg.num_blocks / blocks_per_request(cfg, wl)


def rate_for_usage(cfg: EngineConfig, wl: Workload, usage: float) -> float:
    """Arrival rate (req/s) at which the KV pool is ``usage`` full on average."""
    return throughput(cfg, wl, concurrency_for_usage(cfg, wl, usage))


def pool_for_usage(cfg: EngineConfig, wl: Workload, lam: float, usage: float) -> int:
    """Number of blocks that ``lam`` arrivals/s fill to ``usage`` on average."""
    blocks = concurrency_at(cfg, wl, lam) * blocks_per_request(cfg, wl) / usage
    return max(int(blocks), -(-cfg.max_model_len // cfg.block_size))


def reserved_concurrency(cfg: EngineConfig, wl: Workload) -> float:
    """Requests admitted at once when each reserves prompt + max_tokens blocks."""
    prompt, _ = sample_lengths(cfg, wl)
    max_tok = np.minimum(wl.max_tokens, cfg.max_model_len - prompt)
    blocks = float(np.ceil((prompt + max_tok) / cfg.block_size).mean())
    return cfg.num_blocks * (1.0 - cfg.watermark_frac) / blocks
