"""Window statistics of every target at once: one numpy pass per (signal, span, statistic).

The diagnosis core asks the same questions of every target ("share of the last 10
minutes with KV usage ≥ 0.88"). Answering them per target costs a dozen small numpy
calls each; stacking each signal into a targets × samples matrix answers them for
the whole fleet in one call. The kernels live in the statistics registry
(:mod:`kvwatch.core.statistics.registry`); this module builds the matrices
(canonical and derived signals) and memoises the answers.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence

import numpy as np

from kvwatch.core.bounds import clamped
from kvwatch.core.dialects import aborts_count_as_finished
from kvwatch.core.frame import FleetData
from kvwatch.core.models import TargetKey
from kvwatch.core.signals import Signal
from kvwatch.core.statistics.registry import REGISTRY, SpanMatrix

_SIGNALS: dict[str, Signal] = {s.value: s for s in Signal}

#: a queue worth this many seconds of throughput (Little's law) was held, not caught between two
#: admissions: the same 15 s as oscillating-kv-swings' ``queue_wait.episodes(15)``
HELD_QUEUE_S = 15.0
#: preemptions per second above this are an eviction at all (the rules' ``0.0001``)
PREEMPTION_FLOOR = 1e-4
#: evictions per finishing request that make a burst rather than one preemption in the rate window
BURST_SHARE = 0.05


class FleetStats:
    """Lazy, memoised per-fleet statistics over spans ending at ``at`` (Unix seconds)."""

    def __init__(self, keys: Sequence[TargetKey], data: FleetData, at: float, ttft_slo_s: float | None = None,
                 latency_hold: int = 1, latency_window_s: float = 600.0) -> None:
        """``ttft_slo_s``: the TTFT SLO the derived latency signals are read against (None: not
        known, read every sample); ``latency_hold``: grid steps between two latency-quantile
        samples (collection holds each over the steps after it); ``latency_window_s``: the
        window those quantiles are taken over, s."""
        self.keys = list(keys)
        self.ttft_slo_s = ttft_slo_s
        self.latency_hold = max(1, latency_hold)
        self.latency_window_s = latency_window_s
        self.row = {k: i for i, k in enumerate(self.keys)}
        self.data = data
        self.at = at
        self._mats: dict[str, np.ndarray | None] = {}
        self._vec: dict[tuple[str, float, str, float | None], np.ndarray | None] = {}
        self._spans: dict[tuple[str, float], SpanMatrix] = {}
        self._cols: dict[tuple[str, float, str, float | None], list[float] | None] = {}
        self._clamp: dict[tuple[tuple[str, ...], float], np.ndarray] = {}
        self._ceil: dict[Signal, np.ndarray] = {}
        self._first: dict[tuple[str, float], np.ndarray | None] = {}
        self._starts: dict[float, int] = {}

    def start(self, span_s: float) -> int:
        """Index of the first grid point inside (at − span, at]."""
        i0 = self._starts.get(span_s)
        if i0 is None:
            i0 = self._starts[span_s] = int(np.searchsorted(self.data.grid, self.at - span_s - 1e-6, side="right"))
        return i0

    def _while_queued(self, a: np.ndarray | None) -> np.ndarray | None:
        """``a`` at the samples where requests waited (waiting ≥ 0.5), NaN elsewhere; ``a``
        unchanged where the target exports no queue gauge (every sample counts)."""
        w = self.matrix("waiting")
        return a if a is None or w is None else np.where(w < 0.5, np.nan, a)

    def _ratio(self, num: str, den: str) -> np.ndarray | None:
        """``num / den`` point-wise, NaN where ``den`` is not positive; None without either."""
        a, b = self.matrix(num), self.matrix(den)
        if a is None or b is None:
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(b > 0, a / b, np.nan)

    def matrix(self, name: str) -> np.ndarray | None:
        """targets × grid values of a canonical or derived signal (NaN rows for targets without it)."""
        if name in self._mats:
            return self._mats[name]
        m: np.ndarray | None
        if name == "ttft_tail_ratio":
            m = self._ratio("ttft_p99", "ttft_p50")
        elif name == "queue_tail_share":
            # TTFT is queue time plus prefill: a p99 that is mostly queue time is a tail the
            # queue made (bursts), where a slice of slow requests is slow in prefill instead.
            # Only samples whose p99 breaks the SLO say whose tail it is: between two bursts a
            # 0.2 s p99 of which 0.1 s is queue is no slice (held-out rnd-163-017). Nor is the
            # sample where a burst's tail enters the TTFT window: engines observe queue time as
            # a request finishes, its TTFT at the first token, so the queue-time window may
            # take the same requests in a sample later (rnd-163-017: 4.54 s against 0.1 s)
            m = self._ratio("queue_p99", "ttft_p99")
            p99 = self.matrix("ttft_p99")
            if m is not None and p99 is not None and self.ttft_slo_s is not None:
                over = p99 > self.ttft_slo_s
                h = self.latency_hold
                entered = np.zeros(over.shape, dtype=bool)  # over now, under at the sample before
                entered[:, h:] = over[:, h:] & ~over[:, :-h] & np.isfinite(p99[:, :-h])
                m = np.where(over & ~entered, m, np.nan)
        elif name == "ttft_p99_prior":
            # the TTFT p99 one latency window earlier: its window ends where the newest one's
            # starts, so a tail it holds was there before the newest window's requests
            p99 = self.matrix("ttft_p99")
            m = None
            if p99 is not None:
                g = self.data.grid
                k = round(self.latency_window_s / float(g[1] - g[0])) if len(g) > 1 and g[1] > g[0] else 0
                m = np.full(p99.shape, np.nan)
                if 0 < k < p99.shape[1]:
                    m[:, k:] = p99[:, :-k]
        elif name == "completion_rate":
            # progress where tokens are not counted: most engines count an aborted request (a
            # client that gave up on a wedged engine) as finished, so aborts are taken out there;
            # a counter of successes only (TGI, Triton) already left them out
            a, b = self.matrix("request_rate"), self.matrix("abort_rate")
            m = None
            if a is not None:
                m = a
                if b is not None:
                    counted = np.array([aborts_count_as_finished(self.data.targets[k]) if k in self.data.targets
                                        else True for k in self.keys]).reshape(-1, 1)
                    m = np.where(counted, np.maximum(a - np.where(np.isnan(b), 0.0, b), 0.0), a)
        elif name == "running_queued":
            # running where requests wait: a max_num_seqs ceiling holds running at the cap whenever
            # somebody waits, so running above today's ceiling earlier *with a queue* says the
            # ceiling is not a cap (a trough with nobody waiting says nothing; no queue gauge: all)
            m = self._while_queued(self.matrix("running"))
        elif name == "queue_wait":
            # Little's law: a queue of L requests served at λ requests/s holds each for L/λ s on
            # average, and took at least about that long to build. A queue caught by one sample
            # that holds 15 s of throughput was held, not a blip between two admissions; one
            # request waiting at a pool that serves 5/s was not. Nobody waiting: no wait at all;
            # a queue while nothing finishes has no rate to divide by (a gap, not infinite)
            w, r = self.matrix("waiting"), self.matrix("request_rate")
            m = None
            if w is not None and r is not None:
                with np.errstate(divide="ignore", invalid="ignore"):
                    m = np.where(w < 0.5, np.where(np.isnan(w), np.nan, 0.0), np.where(r > 0, w / r, np.nan))
        elif name == "kv_queued":
            # the pool while requests waited: filling and draining *with* a queue throughout (a
            # queue estimate that never empties between close peaks) rather than around its gaps
            a, w = self.matrix("kv_usage"), self.matrix("waiting")
            m = None if a is None or w is None else np.where(w >= 1.0, a, np.nan)
        elif name == "peak_pressure":
            # 1 at samples where the pool was under any pressure oscillating-kv-swings accepts: a
            # queue of >= 1 held two samples (this one and a neighbour), a queue worth >= 15 s of
            # throughput (queue_wait), or a preemption burst (evictions >= 5 % of the requests
            # finishing: one preemption in the rate window of a busy pool is no burst); 0 where the
            # signals read show none; NaN where none of them is known. Successive peaks may show
            # different kinds (a held queue at one, a burst at the next): each alone may not repeat
            w, qw, pre = self.matrix("waiting"), self.matrix("queue_wait"), self.matrix("preemptions")
            rr = self.matrix("request_rate")
            m = None
            if w is not None or pre is not None:
                shape = (len(self.keys), len(self.data.grid))
                hit, known = np.zeros(shape, dtype=bool), np.zeros(shape, dtype=bool)
                if w is not None:
                    q = w >= 1.0
                    near = np.zeros(shape, dtype=bool)
                    near[:, 1:] |= q[:, :-1]
                    near[:, :-1] |= q[:, 1:]
                    hit |= q & near
                    known |= ~np.isnan(w)
                if qw is not None:
                    hit |= qw >= HELD_QUEUE_S
                    known |= ~np.isnan(qw)
                if pre is not None:
                    floor = np.full(shape, PREEMPTION_FLOOR) if rr is None else np.fmax(
                        PREEMPTION_FLOOR, BURST_SHARE * np.nan_to_num(rr, nan=0.0))
                    hit |= pre > floor
                    known |= ~np.isnan(pre)
                m = np.where(hit, 1.0, np.where(known, 0.0, np.nan))
        elif name == "running_vs_cap":
            a, cap = self.matrix("running"), self.vector("max_running", 0.0, "last")
            m = None if a is None or cap is None else a / np.where(cap > 0, cap, np.nan)[:, None]
        elif name == "running_vs_cap_queued":
            # the cap binds when running sits at it *whenever requests wait*: below the cap with
            # nobody waiting (the trough of a periodic load) is nothing to admit, not a free slot
            # (no queue gauge, or a gap in it: every sample counts, as running_vs_cap)
            m = self._while_queued(self.matrix("running_vs_cap"))
        elif name == "running_vs_queued_max":
            # the limit that made requests wait bounded running while they waited; running far
            # above every earlier queued level means that limit is gone (a cap raised, a restart),
            # even after the admitted backlog has finished and running fell from its peak
            a, w = self.matrix("running"), self.matrix("waiting")
            m = None
            if a is not None and w is not None:
                # causal: the queued samples up to this one (NaN until the first; fmax skips gaps)
                peak = np.fmax.accumulate(np.where(w >= 0.5, a, np.nan), axis=1)
                with np.errstate(divide="ignore", invalid="ignore"):
                    m = np.where(peak > 0, a / peak, np.nan)
        else:
            sig = _SIGNALS.get(name)
            rows = [self.data.values(k, sig) for k in self.keys] if sig is not None else []
            m = None
            if any(r is not None for r in rows):
                m = np.full((len(self.keys), len(self.data.grid)), np.nan)
                for i, r in enumerate(rows):
                    if r is not None:
                        m[i] = r
                m[~np.isfinite(m)] = np.nan  # ±Inf are gaps too
        self._mats[name] = m
        return m

    def vector(self, name: str, span_s: float, stat: str, arg: float | None = None) -> np.ndarray | None:
        """One statistic for every target (NaN where it cannot be computed); span 0 = whole grid."""
        key = (name, span_s, stat, arg)
        if key not in self._vec:
            self._vec[key] = self._compute(name, span_s, stat, arg)
        return self._vec[key]

    def column(self, name: str, span_s: float, stat: str, arg: float | None = None) -> list[float] | None:
        """:meth:`vector` as a list of Python floats, for reading one target at a time
        (indexing a list is several times cheaper than indexing a numpy array)."""
        key = (name, span_s, stat, arg)
        col = self._cols.get(key, self)
        if col is self:
            vec = self.vector(name, span_s, stat, arg)
            col = self._cols[key] = None if vec is None else vec.tolist()
        return col  # type: ignore[return-value]

    def ceiling(self, sig: Signal) -> np.ndarray:
        """Each target's highest finite histogram bound of ``sig`` (NaN: none)."""
        got = self._ceil.get(sig)
        if got is None:
            got = self._ceil[sig] = np.array([c.get(sig, np.nan) for c in self.target_ceilings], dtype=float)
        return got

    @functools.cached_property
    def target_ceilings(self) -> list[dict[Signal, float]]:
        """Each target's ceilings (``FleetData.ceilings``), looked up once per fleet."""
        return [self.data.ceilings.get(k) or {} for k in self.keys]

    @functools.cached_property
    def target_buckets(self) -> list[dict[Signal, tuple[float, ...]]]:
        """Each target's bucket layouts (``FleetData.buckets``), looked up once per fleet."""
        return [self.data.buckets.get(k) or {} for k in self.keys]

    def may_clamp(self, names: Sequence[str], span_s: float) -> np.ndarray:
        """Targets with a sample at the histogram ceiling (:func:`~kvwatch.core.bounds.clamped`)
        in the last ``span_s`` of any of the canonical signals ``names``: only their
        statistics can be lower bounds (every other target's are exact)."""
        key = (tuple(names), span_s)
        got = self._clamp.get(key)
        if got is None:
            got = np.zeros(len(self.keys), dtype=bool)
            if self.data.ceilings:
                i0 = self.start(span_s)
                for name in names:
                    sig, m = _SIGNALS.get(name), self.matrix(name)
                    if sig is not None and m is not None:
                        got |= clamped(m[:, i0:], self.ceiling(sig)[:, None]).any(axis=1)
            self._clamp[key] = got
        return got

    def first_time(self, name: str, span_s: float) -> np.ndarray | None:
        """Time of each target's first sample in the last ``span_s`` (Unix s; NaN: none)."""
        key = (name, span_s)
        if key not in self._first:
            span = self.span(name, span_s)
            if span is None:
                self._first[key] = None
            elif not span.t.size:
                self._first[key] = np.full(len(self.keys), np.nan)
            else:
                self._first[key] = np.where(span.empty, np.nan, span.t[np.argmax(span.ok, axis=1)])
        return self._first[key]

    def _compute(self, name: str, span_s: float, stat: str, arg: float | None) -> np.ndarray | None:
        entry = REGISTRY.get(stat)
        if entry is None or entry.fleet is None:
            raise KeyError(stat)
        span = self.span(name, span_s)
        if span is None:
            return None
        with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows are expected
            return entry.fleet(span, arg)

    def span(self, name: str, span_s: float) -> SpanMatrix | None:
        """The signal's matrix cut to (at − span, at] (span 0 = whole grid), shared by all kernels."""
        key = (name, span_s)
        if key not in self._spans:
            full = self.matrix(name)
            if full is None:
                return None
            i0 = self.start(span_s) if span_s > 0 else 0
            self._spans[key] = SpanMatrix(full[:, i0:], self.data.grid[i0:])
        return self._spans[key]
