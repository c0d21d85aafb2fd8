"""The data view of one target: lazy statistics over named spans, with the fleet-wide cache.

:class:`Params` fixes the instant and spans of one evaluation; :class:`TargetView`
answers "statistic S of signal X over the last N seconds" for one target, from the
fleet kernels where the statistics registry has one (one numpy pass answers every
target) and from a per-series walk otherwise (swings, periodogram).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvwatch.core.bounds import ORDER_STATS, Bound, clamped, classify, straddled
from kvwatch.core.frame import FleetData, latency_hold_steps
from kvwatch.core.models import Target, TargetKey
from kvwatch.core.rules import DERIVED_INPUTS, bucket_signal
from kvwatch.core.signals import Signal
from kvwatch.core.statistics.fleet import FleetStats
from kvwatch.core.statistics.registry import REGISTRY
from kvwatch.core.statistics.series import SeriesStats


@dataclass(frozen=True)
class Params:
    """Evaluation parameters that are not rules: the instant, spans and SLOs (seconds)."""

    at: float
    window_s: float
    step_s: float
    ttft_slo_s: float = 2.0
    #: the window latency quantiles are read over (evaluation.latency_window, widened for slow scrapes)
    latency_window_s: float = 600.0

    @property
    def latency_hold(self) -> int:
        """Grid steps between two latency-quantile samples (each held over the steps after it)."""
        return latency_hold_steps(self.latency_window_s, self.step_s)

    @property
    def latency_reach_s(self) -> float:
        """How far back the requests in the newest latency quantile may have waited: its window,
        its age (sampled every ``hold`` steps and held in between: up to ``hold − 1`` steps old)
        and one step (a queue can outlast its last sample by a step, and the requests it
        admitted at its end get their first token after that)."""
        return self.latency_window_s + self.latency_hold * self.step_s

    @property
    def fresh_s(self) -> float:
        """How recent "now" is: a target with no KV sample in this span is stale (≥ 5 min,
        Prometheus' default lookback, and at least three evaluation steps)."""
        return max(3 * self.step_s, 300.0)


def fleet_stats(keys: Sequence[TargetKey], data: FleetData, params: Params) -> FleetStats:
    """The fleet statistics of ``keys`` at ``params``' instant, read against its SLO and latency
    sampling (the derived latency signals need both)."""
    return FleetStats(keys, data, params.at, params.ttft_slo_s, params.latency_hold, params.latency_window_s)


class TargetView:
    """Lazy statistics of one target over named spans (``for`` tails and the whole window)."""

    def __init__(
        self, target: Target, data: FleetData, params: Params, fleet: FleetStats | None = None
    ) -> None:
        self.target = target
        self.key = target.key
        self.data = data
        self.p = params
        self.fleet = fleet if fleet is not None else fleet_stats([target.key], data, params)
        self.row = self.fleet.row[target.key]
        self._cache: dict[tuple[str, float], SeriesStats] = {}

    def stat(self, name: str, span_s: float, stat: str, arg: float | None = None) -> float | None:
        """One statistic of a signal over the last ``span_s`` seconds (None: not computable).

        Fleet-wide vectorised where possible (one numpy pass answers every target),
        per series otherwise (swings, periodogram).
        """
        entry = REGISTRY.get(stat)
        if entry is None:
            raise KeyError(stat)
        if entry.fleet is not None:
            col = self.fleet.column(name, span_s, stat, arg)
            if col is None:
                return None
            x = col[self.row]
            return x if math.isfinite(x) else None
        st = self.stats(name, span_s)
        if st is None:
            return None
        value = entry.series(st, arg)  # type: ignore[misc]  # every statistic has one or the other
        return None if value is None else float(value)

    def bound(self, name: str, span_s: float, stat: str, arg: float | None, value: float) -> Bound:
        """Whether ``value`` (that statistic) is exact, a lower bound (a quantile past the last
        histogram bucket in the span) or cannot be told ("?"). Cheap when nothing is clamped."""
        ceil = self.data.ceilings.get(self.key)
        if not ceil or not self.fleet.may_clamp(DERIVED_INPUTS.get(name, (name,)), span_s)[self.row]:
            return ""  # no sample at a ceiling: exact (the fleet-wide check is one numpy pass)
        i0 = self._start(span_s)
        if stat == "last":
            # only the newest sample decides a `last`: a quantile clamped earlier in the span
            # (an episode's tail that has left the latency window) says nothing about it
            own = self.raw(name)
            fin = np.flatnonzero(np.isfinite(own[i0:])) if own is not None else np.empty(0, int)
            i0 = i0 + int(fin[-1]) if len(fin) else i0
        if name == "ttft_tail_ratio":
            c99, c50 = ceil.get(Signal.TTFT_P99), ceil.get(Signal.TTFT_P50)
            p50 = self.raw("ttft_p50")
            if c50 is not None and p50 is not None and clamped(p50[i0:], c50).any():
                return "?"  # the median itself is only a bound: the ratio is no number at all
            p99, vals = self.raw("ttft_p99"), self.raw(name)
            if c99 is None or p99 is None or vals is None:
                return ""
            mask, vals = clamped(p99[i0:], c99), vals[i0:]
        elif name == "queue_tail_share":
            # either p99 past its last bucket bounds the ratio from one side or the other
            for sig in (Signal.QUEUE_P99, Signal.TTFT_P99):
                c, raw = ceil.get(sig), self.raw(sig.value)
                if c is not None and raw is not None and clamped(raw[i0:], c).any():
                    return "?"
            return ""
        else:
            sig = Signal._value2member_map_.get(name)
            c = ceil.get(sig) if sig is not None else None  # type: ignore[call-overload]
            vals = self.raw(name)
            if c is None or vals is None:
                return ""
            vals = vals[i0:]
            mask = clamped(vals, c)
        ok = np.isfinite(vals)
        return classify(stat, arg, value, vals[ok], mask[ok])

    def bucket(self, name: str, stat: str, value: float, threshold: float) -> tuple[float, float] | None:
        """The histogram bucket ``(lo, hi]`` that holds ``value`` (an order statistic of the
        quantile signal ``name``) when ``threshold`` lies inside it: the comparison is then
        undecided by the data. None when decided or the bucket layout is not known."""
        if stat not in ORDER_STATS:
            return None
        sig = bucket_signal(name)
        bounds = self.data.buckets.get(self.key, {}).get(sig) if sig is not None else None
        return straddled(value, threshold, bounds) if bounds else None

    def first_time(self, name: str, span_s: float) -> float | None:
        """Time of the first sample of ``name`` in the last ``span_s`` seconds (None: no sample)."""
        vec = self.fleet.first_time(name, span_s)
        x = math.nan if vec is None else float(vec[self.row])
        return x if math.isfinite(x) else None

    def raw(self, name: str) -> np.ndarray | None:
        """This target's row of a canonical or derived signal (derived ones are defined once,
        in :meth:`FleetStats.matrix`)."""
        m = self.fleet.matrix(name)
        return None if m is None else m[self.row]

    def stats(self, name: str, span_s: float) -> SeriesStats | None:
        """The per-series view of one signal over the last ``span_s`` seconds (cached)."""
        key = (name, span_s)
        st = self._cache.get(key)
        if st is None:
            v = self.raw(name)
            if v is None:
                return None
            i0 = self._start(span_s)
            st = self._cache[key] = SeriesStats(self.data.grid[i0:], v[i0:], len(v) - i0)
        return st

    def _start(self, span_s: float) -> int:
        """Index of the first grid point inside (at − span, at]; the grid is sorted."""
        return self.fleet.start(span_s)
