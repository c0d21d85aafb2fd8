"""The collected data of one evaluation: every signal of every target on one time grid.

Range queries return samples exactly at ``start + k*step``, so all series align
on one grid and derived signals are element-wise. Missing samples are NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvwatch.core.models import Target, TargetKey
from kvwatch.core.signals import Signal


@dataclass
class FleetData:
    """``grid``: Unix seconds, oldest first. ``series[key][signal]``: values on the grid."""

    grid: np.ndarray
    targets: dict[TargetKey, Target]
    series: dict[TargetKey, dict[Signal, np.ndarray]] = field(default_factory=dict)
    #: signals that have a source (metric names exist) per target, even if they hold no samples
    sourced: dict[TargetKey, set[Signal]] = field(default_factory=dict)
    #: extra per-target values read from labels (e.g. vLLM cache_config_info)
    extras: dict[TargetKey, dict[str, float]] = field(default_factory=dict)

    def values(self, key: TargetKey, signal: Signal) -> np.ndarray | None:
        return self.series.get(key, {}).get(signal)

    def put(self, key: TargetKey, signal: Signal, values: np.ndarray) -> None:
        self.series.setdefault(key, {})[signal] = values

    def to_frame(self) -> pd.DataFrame:
        """Tidy frame: one row per (target, signal, timestamp) with a finite value."""
        rows: list[pd.DataFrame] = []
        for key, sigs in self.series.items():
            for sig, vals in sigs.items():
                ok = np.isfinite(vals)
                if not ok.any():
                    continue
                rows.append(
                    pd.DataFrame(
                        {
                            "job": key.job,
                            "instance": key.instance,
                            "signal": sig.value,
                            "ts": pd.to_datetime(self.grid[ok], unit="s", utc=True),
                            "value": vals[ok],
                        }
                    )
                )
        if not rows:
            return pd.DataFrame(columns=["job", "instance", "signal", "ts", "value"])
        return pd.concat(rows, ignore_index=True)
