"""Per-step views over the in-memory history: what one evaluation at ``t`` would have fetched.

A :class:`WindowData` is a :class:`~kvwatch.core.frame.FleetData` whose grid is
the slice ``[t − window, t]`` of the history grid; series are sliced lazily
(numpy views, no copies), so a step costs only what the diagnosis reads.
"""

from __future__ import annotations

import numpy as np

from kvwatch.core.frame import FleetData
from kvwatch.core.models import TargetKey
from kvwatch.core.signals import Signal

#: tolerance when matching grid timestamps (float seconds)
_EPS = 1e-6


class WindowData(FleetData):
    """``base`` restricted to grid points in ``[at − window_s, at]`` (both ends inclusive, like ``collect``)."""

    def __init__(self, base: FleetData, at: float, window_s: float) -> None:
        lo = int(np.searchsorted(base.grid, at - window_s - _EPS, side="left"))
        hi = int(np.searchsorted(base.grid, at + _EPS, side="right"))
        super().__init__(grid=base.grid[lo:hi], targets=base.targets, sourced=base.sourced, extras=base.extras,
                         ceilings=base.ceilings)
        self._base = base
        self._slice = slice(lo, hi)

    def values(self, key: TargetKey, signal: Signal) -> np.ndarray | None:
        v = self._base.values(key, signal)
        return None if v is None else v[self._slice]

    def put(self, key: TargetKey, signal: Signal, values: np.ndarray) -> None:
        raise TypeError("WindowData is a read-only view")


def first_seen(data: FleetData) -> dict[TargetKey, float]:
    """Per target, the first grid time any of its signals has a finite sample (absent: never seen)."""
    out: dict[TargetKey, float] = {}
    for key, sigs in data.series.items():
        firsts = [int(np.argmax(np.isfinite(v))) for v in sigs.values() if np.isfinite(v).any()]
        if firsts:
            out[key] = float(data.grid[min(firsts)])
    return out
