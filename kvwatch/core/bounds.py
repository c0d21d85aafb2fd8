"""Quantiles past the last finite histogram bucket: lower bounds, never fake numbers.

``histogram_quantile`` returns the highest finite ``le`` when the quantile falls into the
``+Inf`` bucket, so "TTFT p99 = 30 s" may mean "more than 30 s". The collector records
that ceiling per target and signal; a sample at the ceiling is a lower bound. A statistic
over samples that include such a sample is then exact, a lower bound (``">"``), or
cannot be told at all (``"?"``) — e.g. a tail ratio whose median is clamped too.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Bound = Literal["", ">", "?"]

#: statistics that return one of the samples (or an interpolation between neighbours):
#: a lower bound when the result reaches a clamped sample, exact below it
_ORDER = frozenset({"min", "max", "median", "last", "quantile", "p10", "p25", "p50", "p75", "p90", "p99"})
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
    if stat in _ORDER:
        return ">" if result >= low * (1 - _EPS) else ""
    if stat == "mean":
        return ">"
    if stat == "frac_above" and arg is not None:
        return "" if low > arg else "?"  # a clamped sample above arg is above it, whatever its true value
    if stat == "frac_below" and arg is not None:
        return "" if low >= arg else "?"
    return "?"  # spread, slope, swings … of values that are only bounds
