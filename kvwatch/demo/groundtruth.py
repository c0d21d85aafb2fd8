"""PromQL's range arithmetic on sampled arrays, for the in-process demo backend.

The in-process backend has no PromQL engine: :mod:`kvwatch.demo.promlite` applies
these to the series a simulated engine exposes, on its scrape times — ``rate()``
over the rate window for counters, ``histogram_quantile`` (linear interpolation
inside the bucket, upper bound of the last finite bucket for the +Inf bucket) over
bucket increases, and ``rate(sum)/rate(count)`` for means.
Units: seconds, requests, tokens; NaN where Prometheus would return nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvwatch.core.quantile import quantile_rows


def _lag(n: int, grid: np.ndarray, window_s: float) -> np.ndarray:
    """Index of the sample ``window_s`` before each grid point (-1 where none)."""
    idx = np.searchsorted(grid, grid - window_s + 1e-6, side="left")
    return np.where(grid - grid[0] >= window_s - 1e-6, idx, -1)


def rate(counter: np.ndarray, grid: np.ndarray, window_s: float) -> np.ndarray:
    """Per-second increase over the trailing window (counter resets count from 0), NaN before one window."""
    c = np.asarray(counter, dtype=float)
    inc = np.diff(c, prepend=c[0])
    inc = np.where(inc < 0, c, inc)  # reset: the new value is the increase
    cum = np.cumsum(inc)
    lag = _lag(len(c), grid, window_s)
    out = np.full(len(c), np.nan)
    ok = lag >= 0
    span = grid[ok] - grid[lag[ok]]
    with np.errstate(divide="ignore", invalid="ignore"):
        out[ok] = np.where(span > 0, (cum[ok] - cum[lag[ok]]) / span, np.nan)
    return out


def histogram_quantile(q: float, bounds: Sequence[float], cumulative: np.ndarray,
                       grid: np.ndarray, window_s: float) -> np.ndarray:
    """``histogram_quantile(q, rate(x_bucket[w]))`` for every grid point.

    ``cumulative``: (T, len(bounds) + 1) cumulative bucket counts, the last column +Inf.
    The interpolation is :func:`kvwatch.core.quantile.quantile_rows`, the one kvwatch
    applies to Prometheus' bucket answers (a rate scales every bucket alike, so the bucket
    increases give the same quantile). NaN before one window and where no observation fell
    in it (Prometheus returns NaN too).
    """
    cum = np.asarray(cumulative, dtype=float)
    lag = _lag(len(cum), grid, window_s)
    out = np.full(len(cum), np.nan)
    rows = np.nonzero(lag >= 0)[0]
    d = cum[rows] - cum[lag[rows]]
    ok = d[:, -1] > 0 if len(rows) else np.zeros(0, dtype=bool)
    rows, d = rows[ok], d[ok]
    if len(rows):
        edges = np.append(np.asarray(bounds, dtype=float), np.inf)
        out[rows] = quantile_rows([q], edges, d, np.ones(d.shape, dtype=bool))[0]
    return out


def histogram_mean(sums: np.ndarray, counts: np.ndarray, grid: np.ndarray, window_s: float) -> np.ndarray:
    """``rate(x_sum[w]) / rate(x_count[w])``; NaN where nothing was observed."""
    num, den = rate(sums, grid, window_s), rate(counts, grid, window_s)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / den, np.nan)
