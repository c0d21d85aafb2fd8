"""Per-step views over the in-memory history: what one evaluation at ``t`` would have fetched.

A :class:`WindowData` is a :class:`~kvwatch.core.frame.FleetData` whose grid is
the slice ``[t − window, t]`` of the history grid; series are sliced lazily
(numpy views, no copies), so a step costs only what the diagnosis reads.
"""

from __future__ import annotations

import numpy as np

from kvwatch.core.frame import FleetData
from kvwatch.core.models import Target, TargetKey
from kvwatch.core.signals import Signal

#: tolerance when matching grid timestamps (float seconds)
_EPS = 1e-6


class WindowData(FleetData):
    """``base`` restricted to grid points in ``[at − window_s, at]`` (both ends inclusive, like ``collect``)."""

    def __init__(self, base: FleetData, at: float, window_s: float) -> None:
        lo = int(np.searchsorted(base.grid, at - window_s - _EPS, side="left"))
        hi = int(np.searchsorted(base.grid, at + _EPS, side="right"))
        super().__init__(grid=base.grid[lo:hi], targets=base.targets, sourced=base.sourced, extras=base.extras,
                         ceilings=base.ceilings, buckets=base.buckets, rate_window_s=base.rate_window_s,
                         scrape_interval_s=base.scrape_interval_s, target_rate_window_s=base.target_rate_window_s)
        self._base = base
        self._slice = slice(lo, hi)

    def values(self, key: TargetKey, signal: Signal) -> np.ndarray | None:
        v = self._base.values(key, signal)
        return None if v is None else v[self._slice]

    def put(self, key: TargetKey, signal: Signal, values: np.ndarray) -> None:
        raise TypeError("WindowData is a read-only view")


class StepView(FleetData):
    """One step of a layered history: each target of the step reads the layer of its identity.

    ``route`` maps a target to its layer (see ``history.fetch_layers``); targets not
    routed (stale, gone: no sources) read nothing, as in a fresh collection.
    """

    def __init__(self, layers: list[FleetData], route: dict[TargetKey, int], targets: list[Target],
                 at: float, window_s: float) -> None:
        views = [WindowData(layer, at, window_s) for layer in layers]
        super().__init__(grid=views[0].grid, targets={t.key: t for t in targets}, rate_window_s=layers[0].rate_window_s,
                         scrape_interval_s=layers[0].scrape_interval_s)
        self._views, self._route = views, route
        for t in targets:
            i = route.get(t.key)
            src = layers[i] if i is not None else None
            self.sourced[t.key] = set(src.sourced.get(t.key, ())) if src is not None else set()
            if src is not None and t.key in src.extras:
                self.extras[t.key] = src.extras[t.key]
            if src is not None and t.key in src.ceilings:
                self.ceilings[t.key] = src.ceilings[t.key]
            if src is not None and t.key in src.buckets:
                self.buckets[t.key] = src.buckets[t.key]
            if src is not None and t.key in src.target_rate_window_s:
                self.target_rate_window_s[t.key] = src.target_rate_window_s[t.key]

    def values(self, key: TargetKey, signal: Signal) -> np.ndarray | None:
        i = self._route.get(key)
        return None if i is None else self._views[i].values(key, signal)

    def put(self, key: TargetKey, signal: Signal, values: np.ndarray) -> None:
        raise TypeError("StepView is a read-only view")


def overlay(layers: list[FleetData]) -> FleetData:
    """One history for export and charts: each series from its first layer, gaps filled by later layers."""
    if len(layers) == 1:
        return layers[0]
    out = FleetData(grid=layers[0].grid, targets={k: t for layer in layers for k, t in layer.targets.items()})
    for layer in layers:
        for key, sigs in layer.series.items():
            for sig, vals in sigs.items():
                prev = out.values(key, sig)
                out.put(key, sig, vals.copy() if prev is None else np.where(np.isnan(prev), vals, prev))
        for key, srcs in layer.sourced.items():
            out.sourced.setdefault(key, set()).update(srcs)
    return out


def first_seen(data: FleetData) -> dict[TargetKey, float]:
    """Per target, the first grid time any of its signals has a finite sample (absent: never seen)."""
    out: dict[TargetKey, float] = {}
    for key, sigs in data.series.items():
        firsts = [int(np.argmax(np.isfinite(v))) for v in sigs.values() if np.isfinite(v).any()]
        if firsts:
            out[key] = float(data.grid[min(firsts)])
    return out
