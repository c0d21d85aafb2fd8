"""Request records of the engine model and a pre-sampled pool of arriving requests."""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kvwatch.sim.engine import EngineConfig
    from kvwatch.sim.workload import Workload

WAIT, PREFILL, DECODE = 0, 1, 2
Shape = tuple[float, int, int, int, int, int]  # arrival, prompt, out, max_tok, cached, reserve


class Req:
    """One admitted request (token counts; times in seconds of simulated time).

    ``reserve`` is its prompt + max_tokens reservation in blocks (reserve-for-max-output).
    """

    __slots__ = ("arrival", "blocks", "cached", "first", "gen", "left", "max_tok", "npre",
                 "out", "prompt", "q", "r", "reserve", "sched", "seq", "state", "x")

    def __init__(self, shape: Shape, seq: int, sched: float, blocks: int) -> None:
        """A request admitted at ``sched`` as running number ``seq`` holding ``blocks``."""
        arrival, self.prompt, self.out, self.max_tok, self.cached, self.reserve = shape
        self.arrival = arrival
        self.sched = sched if sched > arrival else arrival  # last time scheduled
        self.first: float | None = None  # first-token time
        self.npre = 0  # times preempted
        self.gen = 0  # tokens generated when last not decoding
        self.left: float = self.prompt - self.cached  # prefill tokens still to compute
        self.x = self.q = self.r = 0  # decode offset and its divmod by block_size
        self.seq = seq
        self.state = PREFILL
        self.blocks = blocks  # blocks held while prefilling


class ArrivalPool:
    """Request shapes sampled in batches so that each arrival costs O(1) Python work."""

    def __init__(self, rng: np.random.Generator, size: int = 1024) -> None:
        self.rng, self.size = rng, size
        self._rows: list[tuple[int, int, int, int, int, float]] = []

    def clear(self) -> None:
        """Drop pre-sampled shapes (after a workload or policy change)."""
        self._rows = []

    def take(self, k: int, t: float, cfg: EngineConfig, workload: Workload) -> list[Shape]:
        """Shapes of ``k`` requests arriving during the step that starts at ``t``.

        A shape is ``(arrival, prompt, out, max_tokens, cached, reserve_blocks)``; it becomes
        a ``Req`` only when admitted, so requests that merely wait cost almost nothing.
        """
        if len(self._rows) < k:
            self._refill(max(self.size, k), cfg, workload)
        rows, self._rows = self._rows[-k:], self._rows[:-k]
        dt = cfg.dt
        return [(t + u * dt, p, o, m, c, r) for p, o, m, c, r, u in rows]

    def _refill(self, n: int, cfg: EngineConfig, workload: Workload) -> None:
        rng, bs = self.rng, cfg.block_size
        prompt, out, max_tok = workload.lengths(rng, n, cfg.max_model_len)
        hit_frac = np.minimum(2 * workload.prefix_hit_frac * rng.random(n), 0.95)
        cached = np.floor(prompt * hit_frac / bs) * bs
        reserve = np.ceil((prompt + max_tok) / bs)
        cols = (prompt, out, max_tok, cached, reserve)
        ints = [c.astype(np.int64).tolist() for c in cols]
        self._rows = list(zip(*ints, rng.random(n).tolist(), strict=True)) + self._rows


def share_prefill(reqs: list[Req], budget: float
                   ) -> tuple[list[tuple[Req, float]], list[Req]]:
    """Processor sharing of ``budget`` prefill tokens over ``reqs`` (updates ``left``).

    Returns the requests that complete, each with the fraction of the prefill time at which
    it completes, and the requests still prefilling.
    """
    if len(reqs) == 1:
        req = reqs[0]
        if req.left <= budget + 1e-6:
            req.left = 0.0
            return [(req, 1.0)], []
        req.left -= budget
        return [], reqs
    order = sorted(reqs, key=_BY_LEFT)
    k = len(order)
    scale = budget if budget > 1e-12 else 1e-12
    completed: list[tuple[Req, float]] = []
    before = 0.0
    for i, req in enumerate(order):
        need = req.left
        cost = before + need * (k - i)  # budget at which this request completes
        if cost > budget + 1e-6:
            level = (budget - before) / (k - i)
            rest = order[i:]
            for r in rest:
                r.left -= level
            return completed, rest
        completed.append((req, cost / scale if cost < scale else 1.0))
        before += need
        req.left = 0.0
    return completed, []


_BY_LEFT = attrgetter("left")
