"""Ground-truth recording of an engine run and read-only views of its state.

An ``EngineView`` holds gauges, counters and histogram state either as scalars (live
server, one instant) or as arrays over scrape times (backfill); exposition code is written
once against it and works for both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvwatch.sim.buckets import HistBank, select

if TYPE_CHECKING:
    from kvwatch.sim.engine import EngineConfig

#: cumulative counters kept by the engine (tokens, requests, microseconds)
COUNTERS: tuple[str, ...] = (
    "preemptions", "prompt_tokens", "generation_tokens", "prefix_queries", "prefix_hits",
    "success_stop", "success_length", "aborted", "arrived", "iterations", "queue_us",
    "request_us",
)
#: instantaneous gauges after each step (usage fractions 0-1, counts, tokens, tokens/s, s)
GAUGES: tuple[str, ...] = (
    "usage", "alloc_frac", "used_blocks", "alloc_blocks", "running", "waiting", "paused",
    "prefilling", "decoding", "prefill_tokens", "prompt_tps", "gen_tps", "itl",
    "num_blocks", "max_num_seqs", "blocked", "running_shown",
)
#: ``running_shown``: running as a gauge read after each step's finished requests left shows it
#: (vLLM's ``num_requests_running``): less the requests that finished in the step's last
#: iteration whose slots the next step refills (``running`` counts them refilled)
#: codes of the ``blocked`` gauge: why the head of the queue was not admitted after a step
#: (ground truth for mechanism labels; never exported)
BLOCKED_NONE, BLOCKED_SLOTS, BLOCKED_KV, BLOCKED_POLICY, BLOCKED_STALLED = range(5)

Value = float | np.ndarray


@dataclass(frozen=True)
class EngineView:
    """State of one engine at one instant (scalars) or at T instants (arrays)."""

    config: EngineConfig
    g: dict[str, Value]
    c: dict[str, Value]
    hist_state: np.ndarray
    bank: HistBank
    wall_time: Value  # seconds since the Unix epoch

    @classmethod
    def from_vectors(cls, config: EngineConfig, gauges: np.ndarray, counters: np.ndarray,
                     hist_state: np.ndarray, bank: HistBank, wall_time: Value) -> EngineView:
        g = {name: gauges[..., i] for i, name in enumerate(GAUGES)}
        c = {name: counters[..., i] for i, name in enumerate(COUNTERS)}
        return cls(config, g, c, hist_state, bank, wall_time)

    def hist(self, name: str, bounds: Sequence[float]
             ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """Cumulative bucket counts at ``bounds`` then +Inf, the count and the sum."""
        return select(self.bank, name, self.hist_state, bounds)

    def hist_sum(self, name: str) -> Value:
        """The running sum of histogram ``name`` (e.g. tokens of the requests finished so far)."""
        return self.hist_state[..., self.bank.size + self.bank.index[name]]


class Recorder:
    """Collects per-step ground truth (gauges, counters, TTFT events) and histogram snapshots."""

    def __init__(self) -> None:
        self._t: list[float] = []
        self._g: list[list[float]] = []
        self._c: list[tuple[float, ...]] = []
        self._ttft: list[tuple[float, float]] = []
        self._h_idx: list[int] = []
        self._h: list[np.ndarray] = []

    def append(self, t: float, gauges: list[float], counters: list[float],
               ttft_events: list[tuple[float, float]] | None) -> None:
        """Record one step: gauges and counters after it, and its (time, TTFT) events."""
        self._t.append(t)
        self._g.append(gauges)
        self._c.append(tuple(counters))
        if ttft_events:
            self._ttft.extend(ttft_events)

    def snapshot_hist(self, hist: HistBank) -> None:
        """Keep the histogram state after the last appended step (call at scrape steps)."""
        self._h_idx.append(len(self._t) - 1)
        self._h.append(hist.state())

    def trace(self, config: EngineConfig, bank: HistBank) -> Trace:
        ttft = np.asarray(self._ttft, dtype=float).reshape(-1, 2)
        return Trace(
            config=config, bank=bank, t=np.asarray(self._t), gauges=np.asarray(self._g),
            counters=np.asarray(self._c), hist_idx=np.asarray(self._h_idx, dtype=int),
            hist=np.vstack(self._h) if self._h else np.zeros((0, bank.size)),
            ttft_at=ttft[:, 0], ttft=ttft[:, 1],
        )


@dataclass(frozen=True)
class Trace:
    """Ground truth of one engine run: per-step arrays and histogram snapshots."""

    config: EngineConfig
    bank: HistBank
    t: np.ndarray  # (n,) step start times, s
    gauges: np.ndarray  # (n, len(GAUGES))
    counters: np.ndarray  # (n, len(COUNTERS))
    hist_idx: np.ndarray  # (m,) step indices of the histogram snapshots
    hist: np.ndarray  # (m, bank.size + quantities)
    ttft_at: np.ndarray  # first-token times, s
    ttft: np.ndarray  # time to first token, s

    def gauge(self, name: str) -> np.ndarray:
        return self.gauges[:, GAUGES.index(name)]

    def counter(self, name: str) -> np.ndarray:
        return self.counters[:, COUNTERS.index(name)]

    def view(self, wall_times: np.ndarray) -> EngineView:
        """Arrays at the histogram snapshot steps, stamped with ``wall_times`` (epoch s)."""
        idx = self.hist_idx
        return EngineView.from_vectors(self.config, self.gauges[idx], self.counters[idx],
                                       self.hist, self.bank, wall_times)
