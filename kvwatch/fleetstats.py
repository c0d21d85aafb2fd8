"""Window statistics of every target at once: one numpy pass per (signal, span, statistic).

The diagnosis core asks the same questions of every target ("share of the last 10
minutes with KV usage ≥ 0.88"). Answering them per target costs a dozen small numpy
calls each; stacking each signal into a targets × samples matrix answers them for
the whole fleet in one call. Semantics match :class:`kvwatch.features.SeriesStats`
exactly (NaN/±Inf are gaps; no samples → no value, never 0); statistics that need
a per-series walk (swings, periodogram) stay there.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from kvwatch.features import MIN_SAMPLES
from kvwatch.fleetdata import FleetData
from kvwatch.models import TargetKey
from kvwatch.signals import Signal

_SIGNALS: dict[str, Signal] = {s.value: s for s in Signal}
_QUANTILES = {"median": 0.5, "p10": 0.1, "p25": 0.25, "p50": 0.5, "p75": 0.75, "p90": 0.9, "p99": 0.99}

#: statistics answered here; the others fall back to SeriesStats per target
VECTOR_STATS: frozenset[str] = frozenset(
    {"mean", "max", "min", "std", "last", "range", "count", "coverage", "slope", "quantile",
     "frac_above", "frac_below", "frac_near_max", *_QUANTILES}
)


class FleetStats:
    """Lazy, memoised per-fleet statistics over spans ending at ``at`` (Unix seconds)."""

    def __init__(self, keys: Sequence[TargetKey], data: FleetData, at: float) -> None:
        self.keys = list(keys)
        self.row = {k: i for i, k in enumerate(self.keys)}
        self.data = data
        self.at = at
        self._mats: dict[str, np.ndarray | None] = {}
        self._vec: dict[tuple[str, float, str, float | None], np.ndarray | None] = {}
        self._sorted: dict[tuple[str, float], tuple[np.ndarray, np.ndarray]] = {}

    def start(self, span_s: float) -> int:
        """Index of the first grid point inside (at − span, at]."""
        return int(np.searchsorted(self.data.grid, self.at - span_s - 1e-6, side="right"))

    def matrix(self, name: str) -> np.ndarray | None:
        """targets × grid values of a canonical or derived signal (NaN rows for targets without it)."""
        if name in self._mats:
            return self._mats[name]
        m: np.ndarray | None
        if name == "ttft_tail_ratio":
            a, b = self.matrix("ttft_p99"), self.matrix("ttft_p50")
            m = None
            if a is not None and b is not None:
                with np.errstate(divide="ignore", invalid="ignore"):
                    m = np.where(b > 0, a / b, np.nan)
        elif name == "running_vs_cap":
            a, cap = self.matrix("running"), self.vector("max_running", 0.0, "last")
            m = None if a is None or cap is None else a / np.where(cap > 0, cap, np.nan)[:, None]
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

    def _compute(self, name: str, span_s: float, stat: str, arg: float | None) -> np.ndarray | None:
        full = self.matrix(name)
        if full is None:
            return None
        m = full[:, self.start(span_s) :] if span_s > 0 else full
        ok = ~np.isnan(m)
        n = ok.sum(axis=1)
        with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            empty = n == 0
            if stat == "count":
                return n.astype(float)
            if stat == "coverage":
                return n / max(m.shape[1], 1)
            if stat == "mean":
                return np.nanmean(m, axis=1)
            if stat == "max":
                return np.nanmax(m, axis=1)
            if stat == "min":
                return np.nanmin(m, axis=1)
            if stat == "range":
                return np.nanmax(m, axis=1) - np.nanmin(m, axis=1)
            if stat == "std":
                return np.nanstd(m, axis=1)
            if stat == "last":
                idx = m.shape[1] - 1 - np.argmax(ok[:, ::-1], axis=1)
                out = m[np.arange(len(m)), idx]
                return np.where(empty, np.nan, out)
            if stat in ("frac_above", "frac_below"):
                x = 0.0 if arg is None else arg
                hit = (m >= x) if stat == "frac_above" else (m <= x)
                return np.where(empty, np.nan, hit.sum(axis=1) / np.maximum(n, 1))
            if stat == "frac_near_max":
                tol = 0.05 if arg is None else arg
                top = np.nanmax(m, axis=1)
                thr = top - np.maximum(top * tol, 1.0)
                frac = (m >= thr[:, None]).sum(axis=1) / np.maximum(n, 1)
                return np.where(empty, np.nan, np.where(top <= 0, 0.0, frac))
            if stat == "slope":
                t = (self.data.grid[-m.shape[1] :] / 60.0)[None, :]
                w = ok.astype(float)
                tm = (t * w).sum(axis=1) / np.maximum(n, 1)
                ym = np.nansum(m, axis=1) / np.maximum(n, 1)
                tc = (t - tm[:, None]) * w
                var = (tc * tc).sum(axis=1)
                cov = (tc * np.nan_to_num(m - ym[:, None])).sum(axis=1)
                return np.where((n >= MIN_SAMPLES) & (var > 0), cov / np.where(var > 0, var, 1), np.nan)
            q = _QUANTILES.get(stat, arg if stat == "quantile" else None)
            if q is not None:
                return self._quantile(name, span_s, m, n, q)
        raise KeyError(stat)

    def _quantile(self, name: str, span_s: float, m: np.ndarray, n: np.ndarray, q: float) -> np.ndarray:
        """numpy's linear-interpolated quantile per row, ignoring NaN, via one sort per (signal, span)."""
        key = (name, span_s)
        if key not in self._sorted:
            self._sorted[key] = (np.sort(m, axis=1), n)  # NaN sort last
        srt, n = self._sorted[key]
        pos = q * np.maximum(n - 1, 0)
        lo = np.floor(pos).astype(int)
        hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
        rows = np.arange(len(srt))
        a, b = srt[rows, lo], srt[rows, hi]
        return np.where(n == 0, np.nan, a + (b - a) * (pos - lo))
