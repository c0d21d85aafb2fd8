"""Quantiles past the last finite histogram bucket: lower bounds, never fake numbers.

``histogram_quantile`` returns the highest finite ``le`` when the quantile falls into the
``+Inf`` bucket, so "TTFT p99 = 30 s" may mean "more than 30 s". The collector records
that ceiling per target and signal; a sample at the ceiling is a lower bound. A statistic
over samples that include such a sample is then exact, a lower bound (``">"``), or
cannot be told at all (``"?"``) — e.g. a tail ratio whose median is clamped too.

Below the ceiling a quantile is an interpolation inside one bucket: it says only that the
true quantile lies in that bucket ``(lo, hi]``. Compared with a threshold strictly inside
the same bucket, it decides nothing (:func:`straddled`).
"""

from __future__ import annotations

import bisect
from typing import Literal

import numpy as np

Bound = Literal["", ">", "?"]

#: statistics that return one of the samples (or an interpolation between neighbours):
#: a lower bound when the result reaches a clamped sample, exact below it
ORDER_STATS = frozenset({"min", "max", "median", "last", "quantile", "p10", "p25", "p50", "p75", "p90", "p99"})
#: relative tolerance when comparing a sample with the bucket bound
_EPS = 1e-9


def clamped(values: np.ndarray, ceiling: float) -> np.ndarray:
    """Mask of samples at (or above) the highest finite bucket bound."""
    with np.errstate(invalid="ignore"):
        return np.asarray(values >= ceiling * (1 - _EPS)) & np.isfinite(values)


def classify(stat: str, arg: float | None, result: float, values: np.ndarray, mask: np.ndarray) -> Bound:
    """Whether ``result`` (``stat`` over the finite ``values``) is exact, a lower bound or unknowable."""
    if not mask.any() or stat in ("count", "coverage"):
        return ""
    low = float(values[mask].min())
    if stat in ORDER_STATS:
        return ">" if result >= low * (1 - _EPS) else ""
    if stat == "mean":
        return ">"
    if stat == "frac_above" and arg is not None:
        return "" if low > arg else "?"  # a clamped sample above arg is above it, whatever its true value
    if stat == "frac_below" and arg is not None:
        return "" if low >= arg else "?"
    return "?"  # spread, slope, swings … of values that are only bounds


def straddled(value: float, threshold: float, bounds: tuple[float, ...]) -> tuple[float, float] | None:
    """The bucket ``(lo, hi]`` (finite ``bounds``, ascending) that holds ``value`` when
    ``threshold`` lies strictly inside it, else None.

    ``histogram_quantile`` interpolates linearly inside the bucket its rank falls into, so
    "value > threshold" is then not decided by the data (the counts at ``lo`` and ``hi``
    are all there is). Below the first bound ``lo`` is 0 (latencies); past the last bound
    the value is a clamp (:func:`classify`), not a bucket.
    """
    i = bisect.bisect_left(bounds, value * (1 - _EPS))
    if i >= len(bounds):
        return None
    hi = bounds[i]
    lo = bounds[i - 1] if i > 0 else 0.0
    return (lo, hi) if lo < threshold < hi * (1 - _EPS) else None
