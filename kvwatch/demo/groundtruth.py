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
    NaN where no observation fell in the window (Prometheus returns NaN too).
    """
    cum = np.asarray(cumulative, dtype=float)
    lag = _lag(len(cum), grid, window_s)
    out = np.full(len(cum), np.nan)
    b = np.asarray(bounds, dtype=float)
    for i in np.nonzero(lag >= 0)[0]:
        d = cum[i] - cum[lag[i]]
        total = d[-1]
        if not total > 0:
            continue
        rank = q * total
        k = int(np.searchsorted(d, rank, side="left"))
        if k >= len(b):  # in the +Inf bucket: the highest finite bound
            out[i] = b[-1]
            continue
        lo_b = 0.0 if k == 0 else b[k - 1]
        lo_c = 0.0 if k == 0 else d[k - 1]
        if k == 0 and b[0] <= 0:
            out[i] = b[0]
            continue
        width = d[k] - lo_c
        out[i] = lo_b + (b[k] - lo_b) * ((rank - lo_c) / width if width > 0 else 1.0)
    return out


def histogram_mean(sums: np.ndarray, counts: np.ndarray, grid: np.ndarray, window_s: float) -> np.ndarray:
    """``rate(x_sum[w]) / rate(x_count[w])``; NaN where nothing was observed."""
    num, den = rate(sums, grid, window_s), rate(counts, grid, window_s)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / den, np.nan)
