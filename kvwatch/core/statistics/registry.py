"""The one table of window statistics: name → argument → fleet kernel → per-series implementation.

Rules name a statistic (``stat: frac_above``), templates read one
(``{kv_usage.p90:.0%}``), the diagnosis core computes them. Each
:class:`Statistic` says whether it needs an ``arg``, how to compute it for every
target at once over a targets × samples matrix (``fleet``, one numpy pass) and
how to compute it for one series (``series``, on :class:`SeriesStats`). The
diagnosis core uses the fleet kernel when there is one and the per-series walk
otherwise (swings, cycles, the periodogram); where both exist they agree, which
``tests/test_statistics.py`` checks on random matrices.

Semantics shared by both: NaN/±Inf are gaps; no samples → no value (NaN/None),
never 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kvwatch.core.statistics.series import MIN_SAMPLES, SeriesStats


@dataclass
class SpanMatrix:
    """One signal over one span for every target: ``m`` (targets × samples, NaN = gap)
    and ``t`` (sample times in Unix seconds), with the counts the kernels share."""

    m: np.ndarray
    t: np.ndarray
    ok: np.ndarray = field(init=False)
    n: np.ndarray = field(init=False)
    _sorted: np.ndarray | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.ok = ~np.isnan(self.m)
        self.n = self.ok.sum(axis=1)

    @property
    def empty(self) -> np.ndarray:
        return self.n == 0

    def quantile(self, q: float) -> np.ndarray:
        """numpy's linear-interpolated quantile per row, ignoring NaN; one sort per span."""
        if self._sorted is None:
            self._sorted = np.sort(self.m, axis=1)  # NaN sort last
        srt, n = self._sorted, self.n
        pos = q * np.maximum(n - 1, 0)
        lo = np.floor(pos).astype(int)
        hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
        rows = np.arange(len(srt))
        a, b = srt[rows, lo], srt[rows, hi]
        return np.where(n == 0, np.nan, a + (b - a) * (pos - lo))


#: vectorised kernel: (span matrix, arg) → one value per target (NaN: not computable).
#: Kernels run with numpy warnings silenced (all-NaN rows are expected).
FleetFn = Callable[[SpanMatrix, "float | None"], np.ndarray]
#: per-series implementation: (series, arg) → value or None
SeriesFn = Callable[[SeriesStats, "float | None"], "float | None"]


@dataclass(frozen=True)
class Statistic:
    name: str
    #: a rule must give ``arg`` (frac_above: the threshold; quantile: q in [0, 1])
    needs_arg: bool
    fleet: FleetFn | None
    series: SeriesFn | None
    #: rules may name it (``count`` is internal: blind-spot and freshness checks)
    in_rules: bool = True


def _last(s: SpanMatrix, arg: float | None) -> np.ndarray:
    idx = s.m.shape[1] - 1 - np.argmax(s.ok[:, ::-1], axis=1)
    return np.where(s.empty, np.nan, s.m[np.arange(len(s.m)), idx])


def _frac(s: SpanMatrix, hit: np.ndarray) -> np.ndarray:
    return np.where(s.empty, np.nan, hit.sum(axis=1) / np.maximum(s.n, 1))


def _near_max(floor: float) -> FleetFn:
    """Share of samples within ``arg`` (relative, default 0.05, at least ``floor`` units) of the max."""
    def fn(s: SpanMatrix, arg: float | None) -> np.ndarray:
        tol = 0.05 if arg is None else arg
        top = np.nanmax(s.m, axis=1)
        thr = top - np.maximum(top * tol, floor)
        frac = (s.m >= thr[:, None]).sum(axis=1) / np.maximum(s.n, 1)
        return np.where(s.empty, np.nan, np.where(top <= 0, 0.0, frac))
    return fn


def _slope(s: SpanMatrix, arg: float | None) -> np.ndarray:
    """Least-squares trend per row in units per minute, gaps weighted out."""
    t = (s.t / 60.0)[None, :]
    w, n = s.ok.astype(float), s.n
    tm = (t * w).sum(axis=1) / np.maximum(n, 1)
    ym = np.nansum(s.m, axis=1) / np.maximum(n, 1)
    tc = (t - tm[:, None]) * w
    var = (tc * tc).sum(axis=1)
    cov = (tc * np.nan_to_num(s.m - ym[:, None])).sum(axis=1)
    return np.where((n >= MIN_SAMPLES) & (var > 0), cov / np.where(var > 0, var, 1), np.nan)


def _opt_float(x: float | int | None) -> float | None:
    return None if x is None else float(x)


def _cycles(dwell: int, open_end: bool = False) -> SeriesFn:
    # excursions to >= arg and back to <= arg/2; sustained (dwell 2): held two samples,
    # so a queue caught for one scrape is not a pressure episode; open_end: *_episodes
    # also count the excursion still under way at the end of the span
    def fn(st: SeriesStats, arg: float | None) -> float | None:
        hi, lo = (arg, arg / 2) if isinstance(arg, int | float) else (0.85, 0.4)
        return _opt_float(st.cycles(hi, lo, dwell, open_end))

    return fn


def _swings(dwell: int, open_end: bool = False) -> SeriesFn:
    # sustained (dwell 2): the pool stays full for at least two consecutive samples
    return lambda st, arg: _opt_float(st.swings(arg if arg is not None else 0.3, dwell, open_end))


def _quantile_stat(name: str, q: float) -> Statistic:
    return Statistic(name, False, lambda s, arg: s.quantile(q), lambda st, arg: st.quantile(q))


_TABLE: tuple[Statistic, ...] = (
    Statistic("count", False, lambda s, arg: s.n.astype(float), lambda st, arg: float(len(st)), in_rules=False),
    Statistic("coverage", False, lambda s, arg: s.n / max(s.m.shape[1], 1), lambda st, arg: st.coverage),
    Statistic("mean", False, lambda s, arg: np.nanmean(s.m, axis=1), lambda st, arg: st.mean),
    Statistic("max", False, lambda s, arg: np.nanmax(s.m, axis=1), lambda st, arg: st.max),
    Statistic("min", False, lambda s, arg: np.nanmin(s.m, axis=1), lambda st, arg: st.min),
    Statistic(
        "range", False, lambda s, arg: np.nanmax(s.m, axis=1) - np.nanmin(s.m, axis=1), lambda st, arg: st.range
    ),
    Statistic("std", False, lambda s, arg: np.nanstd(s.m, axis=1), lambda st, arg: st.std),
    Statistic("last", False, _last, lambda st, arg: st.last),
    Statistic("slope", False, _slope, lambda st, arg: st.slope),
    _quantile_stat("median", 0.5),
    *(_quantile_stat(f"p{p}", p / 100) for p in (10, 25, 50, 75, 90, 99)),
    Statistic("quantile", True, lambda s, arg: s.quantile(arg), lambda st, arg: st.quantile(arg)),
    # the max less the arg quantile, in the signal's units: how deep a count dips below its ceiling
    Statistic(
        "below_max", True,
        lambda s, arg: np.nanmax(s.m, axis=1) - s.quantile(0.1 if arg is None else arg),
        lambda st, arg: st.below_max(0.1 if arg is None else arg),
    ),
    Statistic(
        "frac_above", True,
        lambda s, arg: _frac(s, s.m >= (0.0 if arg is None else arg)),
        lambda st, arg: st.frac_above(0.0 if arg is None else arg),
    ),
    Statistic(
        "frac_below", True,
        lambda s, arg: _frac(s, s.m <= (0.0 if arg is None else arg)),
        lambda st, arg: st.frac_below(0.0 if arg is None else arg),
    ),
    Statistic(
        "frac_near_max", False, _near_max(1.0), lambda st, arg: st.frac_near_max(0.05 if arg is None else arg)
    ),
    # the same band without the one-unit floor: a count's own maximum, where the band is under a unit
    Statistic(
        "frac_at_max", False, _near_max(0.5), lambda st, arg: st.frac_near_max(0.05 if arg is None else arg, 0.5)
    ),
    # walks along one series: no fleet kernel
    Statistic("pinned_tail", False, None, lambda st, arg: st.pinned_tail(0.02 if arg is None else arg)),
    Statistic("last_above", False, None, lambda st, arg: st.last_above),
    Statistic("period", False, None, lambda st, arg: st.period),
    Statistic("periodicity", False, None, lambda st, arg: st.periodicity),
    # how long ago the signal last reached arg: in seconds, and in spacings of its own
    # episode starts (a long cycle in its trough vs a cycle that stopped)
    Statistic("since_above", True, None, lambda st, arg: st.since_above(1.0 if arg is None else arg)),
    # ... and since it was last at arg x its own span maximum (the scale of its peaks)
    Statistic("since_near_peak", True, None, lambda st, arg: st.since_near_peak(0.1 if arg is None else arg)),
    Statistic("quiet_spacings", True, None, lambda st, arg: st.quiet_spacings(1.0 if arg is None else arg)),
    # how regular those episode starts are: std / mean of their spacings (a cycle near 0)
    Statistic("spacing_cv", True, None, lambda st, arg: st.spacing_cv(1.0 if arg is None else arg)),
    # how long the signal sat at or under arg/2 before its newest rise to >= arg (the trough
    # behind the latest peak), in seconds
    Statistic("quiet_before_last", True, None, lambda st, arg: st.quiet_before_last(1.0 if arg is None else arg)),
    # how long ago the signal was last at or under arg, in seconds (None: never in the span)
    Statistic("since_below", True, None, lambda st, arg: st.since_below(0.0 if arg is None else arg)),
    # drains held a minute between excursions to >= arg (a queue emptied between peaks)
    Statistic("held_drains", True, None, lambda st, arg: _opt_float(st.held_drains(1.0 if arg is None else arg))),
    Statistic("cycles", False, None, _cycles(1)),
    Statistic("sustained_cycles", False, None, _cycles(2)),
    # fill-and-drain relative to the span's own peak (arg: the drain as a share of the max)
    Statistic("fill_drain", False, None, lambda st, arg: _opt_float(st.fill_drain(0.5 if arg is None else arg))),
    Statistic("swings", False, None, _swings(1)),
    Statistic("sustained_swings", False, None, _swings(2)),
    # episodes: like the above, plus the excursion under way at the end of the span (a refill
    # that has not drained yet), so "fill, drain, fill again" counts 2 during the second peak
    Statistic("sustained_episodes", False, None, _cycles(2, open_end=True)),
    # every excursion to >= arg (one sample suffices) and back to <= arg/2, the one under way too;
    # without arg (summaries) 0.85 and 0.4: on a count, one or more and back to none
    Statistic("episodes", False, None, _cycles(1, open_end=True)),
    Statistic("swing_episodes", False, None, _swings(1, open_end=True)),
    Statistic(
        "fill_drain_episodes", False, None,
        lambda st, arg: _opt_float(st.fill_drain(0.5 if arg is None else arg, open_end=True)),
    ),
)

#: every statistic by name
REGISTRY: dict[str, Statistic] = {s.name: s for s in _TABLE}

#: statistics a rule may name → needs an ``arg`` (what rule validation reads)
RULE_STATS: dict[str, bool] = {s.name: s.needs_arg for s in _TABLE if s.in_rules}
