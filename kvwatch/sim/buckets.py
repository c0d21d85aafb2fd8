"""Real histogram bucket boundaries of each engine/version, and a bank of histograms.

The engine records every quantity once, into the union of all dialects' boundaries for
that quantity; a dialect's cumulative ``le`` counts are then exact sub-selections.
Sources: engine-metrics.md §1.5 (vLLM), §2.1/§2.3 (TensorRT-LLM), §3 (SGLang).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping

import numpy as np

Bounds = tuple[float, ...]

# --- vLLM (seconds) ---------------------------------------------------------------
VLLM_TTFT_OLD: Bounds = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                         1.0, 2.5, 5.0, 7.5, 10.0)
VLLM_TTFT: Bounds = (*VLLM_TTFT_OLD, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL_OLD: Bounds = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
VLLM_ITL: Bounds = (*VLLM_ITL_OLD, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
VLLM_LATENCY_OLD: Bounds = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                            40.0, 50.0, 60.0)
VLLM_LATENCY: Bounds = (*VLLM_LATENCY_OLD, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

# --- SGLang (seconds) -------------------------------------------------------------
SGLANG_TTFT_OLD: Bounds = (*VLLM_TTFT_OLD, 15.0, 20.0, 25.0, 30.0)
SGLANG_TPOT_OLD: Bounds = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
                           0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
SGLANG_E2E_OLD: Bounds = VLLM_LATENCY_OLD
SGLANG_TTFT: Bounds = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0,
                       80.0, 100.0, 200.0, 400.0)
SGLANG_ITL: Bounds = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04,
                      0.06, 0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
SGLANG_E2E: Bounds = (*SGLANG_TTFT, 600.0, 1200.0, 1800.0, 2400.0)
SGLANG_QUEUE: Bounds = (0.0, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                        50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0,
                        700.0, 800.0, 900.0, 1000.0, 1200.0, 1400.0, 1600.0, 1800.0, 2000.0,
                        2500.0, 3000.0)

# --- token counts -----------------------------------------------------------------
TRITON_TOKENS: Bounds = (10.0, 50.0, 100.0, 500.0, 1000.0)


def vllm_token_buckets(max_model_len: int) -> Bounds:
    """vLLM's 1-2-5 series up to ``max_model_len`` (request_prompt/generation_tokens)."""
    out: list[float] = []
    mantissa, exponent = (1, 2, 5), 0
    while True:
        for m in mantissa:
            v = float(m * 10**exponent)
            if v > max_model_len:
                return tuple(out)
            out.append(v)
        exponent += 1


#: union boundaries recorded by the engine per quantity (max_model_len up to 1M tokens)
UNION: Mapping[str, Bounds] = {
    "ttft": tuple(sorted(set(VLLM_TTFT) | set(SGLANG_TTFT_OLD) | set(SGLANG_TTFT))),
    "itl": tuple(sorted(set(VLLM_ITL) | set(SGLANG_TPOT_OLD) | set(SGLANG_ITL))),
    "tpot_req": VLLM_ITL,
    "e2e": tuple(sorted(set(VLLM_LATENCY) | set(SGLANG_E2E))),
    "queue": tuple(sorted(set(VLLM_LATENCY) | set(SGLANG_QUEUE))),
    "prompt_tokens": tuple(sorted(set(vllm_token_buckets(1_000_000)) | set(TRITON_TOKENS))),
    "gen_tokens": tuple(sorted(set(vllm_token_buckets(1_000_000)) | set(TRITON_TOKENS))),
}
_OFFSET = 1e7  # separates quantities in one sorted axis; every observation stays < 1e7


class HistBank:
    """Cumulative-free histograms of several quantities in one flat counts array.

    ``counts`` holds per-bucket (non-cumulative) counts of every quantity back to back,
    each block ending with its ``+Inf`` bucket; ``sums`` holds the per-quantity sums.
    One ``observe`` call costs one searchsorted and two bincounts for all quantities.
    """

    def __init__(self, union: Mapping[str, Bounds] = UNION) -> None:
        self.names: tuple[str, ...] = tuple(union)
        self.bounds = dict(union)
        self.index = {n: i for i, n in enumerate(self.names)}
        edges: list[float] = []
        self.start: dict[str, int] = {}
        for i, name in enumerate(self.names):
            self.start[name] = len(edges)  # each block has len(bounds)+1 buckets
            edges.extend(i * _OFFSET + b for b in union[name])
            edges.append(i * _OFFSET + _OFFSET / 2)  # upper edge of this block's +Inf bucket
        self._edges = np.asarray(edges)
        self._bisect_edges = {n: list(union[n]) for n in self.names}
        self.size = len(edges)
        self.counts = np.zeros(self.size)
        self.sums = np.zeros(len(self.names))

    def observe(self, obs: Mapping[str, np.ndarray]) -> None:
        """Record arrays of observations, keyed by quantity name."""
        parts = [(self.index[k], v) for k, v in obs.items() if len(v)]
        if not parts:
            return
        qid = np.concatenate([np.full(len(v), i) for i, v in parts])
        vals = np.concatenate([v for _, v in parts])
        keyed = np.minimum(vals, _OFFSET / 4) + qid * _OFFSET
        idx = np.searchsorted(self._edges, keyed, side="left")
        self.counts += np.bincount(idx, minlength=self.size)
        self.sums += np.bincount(qid, weights=vals, minlength=len(self.names))

    def observe_n(self, name: str, value: float, n: float) -> None:
        """Record ``n`` observations of the same ``value`` (scalar fast path)."""
        if n <= 0:
            return
        pos = bisect.bisect_left(self._bisect_edges[name], value)
        self.counts[self.start[name] + pos] += n
        self.sums[self.index[name]] += value * n

    def reset(self) -> None:
        self.counts[:] = 0.0
        self.sums[:] = 0.0

    def state(self) -> np.ndarray:
        """Counts followed by sums, as one copyable vector."""
        return np.concatenate([self.counts, self.sums])


def select(bank: HistBank, name: str, state: np.ndarray, bounds: Iterable[float]
           ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Cumulative counts at ``bounds`` (+Inf last), the count and the sum of ``name``.

    ``state`` is one ``HistBank.state()`` vector or a ``(T, n)`` stack of them.
    """
    union = bank.bounds[name]
    start = bank.start[name]
    block = state[..., start:start + len(union) + 1]
    cum = np.cumsum(block, axis=-1)
    pos = {b: i for i, b in enumerate(union)}
    out = [cum[..., pos[b]] for b in bounds]
    total = cum[..., -1]
    out.append(total)
    s = state[..., bank.size + bank.index[name]]
    return out, total, s
