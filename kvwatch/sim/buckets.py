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

# --- LMDeploy (seconds; lmdeploy/metrics/loggers.py) -------------------------------
LMDEPLOY_ITL: Bounds = (0.005, *VLLM_ITL)  # iter_token_latency and time_per_output_token_seconds

# --- TGI (router/src/server.rs): every *duration histogram has 35 geometric buckets, 1e-4 x 1.5^k ---
TGI_DURATION: Bounds = tuple(round(1e-4 * 1.5**k, 12) for k in range(1, 36))
#: input-length / generated-token buckets are 100 linear steps up to the configured maxima;
#: the simulated router runs with max_input_tokens 4096 and max_total_tokens 8192
TGI_INPUT: Bounds = tuple(4096 / 100 * (x + 1) for x in range(100))
TGI_GENERATED: Bounds = tuple(8192 / 100 * (x + 1) for x in range(100))

# --- token counts -----------------------------------------------------------------
TRITON_TOKENS: Bounds = (10.0, 50.0, 100.0, 500.0, 1000.0)


def vllm_token_buckets(max_model_len: int) -> Bounds:
    """vLLM's 1-2-5 series up to ``max_model_len`` (request_prompt/generation_tokens)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = float(mantissa * 10**exponent)
            if value > max_model_len:
                return tuple(out)
            out.append(value)
        exponent += 1


def _union(*sets: Bounds) -> Bounds:
    return tuple(sorted(set().union(*sets)))


#: union boundaries recorded by the engine per quantity (token counts up to 1M)
UNION: Mapping[str, Bounds] = {
    "ttft": _union(VLLM_TTFT, SGLANG_TTFT_OLD, SGLANG_TTFT),
    "itl": _union(VLLM_ITL, SGLANG_TPOT_OLD, SGLANG_ITL),
    "tpot_req": _union(VLLM_ITL, LMDEPLOY_ITL, TGI_DURATION, SGLANG_ITL),
    "e2e": _union(VLLM_LATENCY, SGLANG_E2E, TGI_DURATION),
    "queue": _union(VLLM_LATENCY, SGLANG_QUEUE, TGI_DURATION),
    "prompt_tokens": _union(vllm_token_buckets(1_000_000), TRITON_TOKENS, TGI_INPUT),
    "gen_tokens": _union(vllm_token_buckets(1_000_000), TRITON_TOKENS, TGI_GENERATED),
}
QUANTITIES: tuple[str, ...] = tuple(UNION)
TTFT, ITL, TPOT_REQ, E2E, QUEUE, PROMPT_TOKENS, GEN_TOKENS = range(len(QUANTITIES))
_OFFSET = 1e7  # separates quantities on one sorted axis; observations are clipped below it


class HistBank:
    """Histograms of all quantities in one flat (non-cumulative) counts vector.

    Producers append plain floats to ``pending[q]`` (cheap; the lists are never replaced);
    they are binned in one searchsorted pass when the state is read. Each quantity's block of ``counts`` ends with
    its ``+Inf`` bucket; ``sums`` holds the per-quantity sums.
    """

    def __init__(self) -> None:
        self.bounds = dict(UNION)
        self.index = {n: i for i, n in enumerate(QUANTITIES)}
        edges: list[float] = []
        self.start: dict[str, int] = {}
        for i, name in enumerate(QUANTITIES):
            self.start[name] = len(edges)
            edges.extend(i * _OFFSET + b for b in UNION[name])
            edges.append(i * _OFFSET + _OFFSET / 2)  # upper edge of the +Inf bucket
        self._edges = np.asarray(edges)
        self._lists = [list(UNION[n]) for n in QUANTITIES]
        self.size = len(edges)
        self.counts = np.zeros(self.size)
        self.sums = np.zeros(len(QUANTITIES))
        self.pending: list[list[float]] = [[] for _ in QUANTITIES]
        self._starts = [self.start[n] for n in QUANTITIES]
        self._weights = [0.0] * self.size  # weighted observations (observe_n), unflushed
        self._wsums = [0.0] * len(QUANTITIES)

    def observe_n(self, q: int, value: float, n: float) -> None:
        """Record ``n`` observations of the same ``value`` of quantity index ``q``."""
        if n > 0:
            self._weights[self._starts[q] + bisect.bisect_left(self._lists[q], value)] += n
            self._wsums[q] += value * n

    def flush(self) -> None:
        """Bin the pending observations."""
        if any(self._wsums):
            self.counts += self._weights
            self.sums += self._wsums
            self._weights = [0.0] * self.size
            self._wsums = [0.0] * len(QUANTITIES)
        sizes = [len(p) for p in self.pending]
        if not any(sizes):
            return
        vals = np.fromiter((v for p in self.pending for v in p), float, sum(sizes))
        qid = np.repeat(np.arange(len(sizes)), sizes)
        keyed = np.minimum(vals, _OFFSET / 4) + qid * _OFFSET
        self.counts += np.bincount(np.searchsorted(self._edges, keyed, side="left"),
                                   minlength=self.size)
        self.sums += np.bincount(qid, weights=vals, minlength=len(sizes))
        for p in self.pending:
            p.clear()

    def reset(self) -> None:
        for p in self.pending:
            p.clear()
        self._weights = [0.0] * self.size
        self._wsums = [0.0] * len(QUANTITIES)
        self.counts[:] = 0.0
        self.sums[:] = 0.0

    def state(self) -> np.ndarray:
        """Counts followed by sums, as one copyable vector."""
        self.flush()
        return np.concatenate([self.counts, self.sums])


def select(bank: HistBank, name: str, state: np.ndarray, bounds: Iterable[float]
           ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Cumulative counts at ``bounds`` then +Inf, the count and the sum of ``name``.

    ``state`` is one ``HistBank.state()`` vector or a ``(T, n)`` stack of them.
    """
    union = bank.bounds[name]
    start = bank.start[name]
    cum = np.cumsum(state[..., start:start + len(union) + 1], axis=-1)
    pos = {b: i for i, b in enumerate(union)}
    total = cum[..., -1]
    out = [cum[..., pos[b]] for b in bounds]
    out.append(total)
    return out, total, state[..., bank.size + bank.index[name]]
