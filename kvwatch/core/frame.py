"""The collected data of one evaluation: every signal of every target on one time grid.

Range queries return samples exactly at ``start + k*step``, so all series align
on one grid and derived signals are element-wise. Missing samples are NaN.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from prometheus_api_client import MetricRangeDataFrame

from kvwatch.core.models import Target, TargetKey
from kvwatch.core.signals import Signal

#: columns of :meth:`FleetData.to_frame`
FRAME_COLUMNS = ("job", "instance", "signal", "ts", "value")


def latency_hold_steps(latency_window_s: float, step_s: float) -> int:
    """Grid steps between latency-quantile samples: about a tenth of the latency window, at
    least 1 (a quantile over a long window changes slowly, so collection samples it coarsely
    and holds each sample over the steps after it: the newest is up to ``hold − 1`` steps old)."""
    if latency_window_s <= 0 or step_s <= 0:
        return 1
    return max(1, int(latency_window_s / 10 // step_s))


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
    #: highest finite histogram bucket bound per target and quantile signal (signal units):
    #: a quantile sample equal to it is only a lower bound (see kvwatch.bounds)
    ceilings: dict[TargetKey, dict[Signal, float]] = field(default_factory=dict)
    #: every finite histogram bucket bound per target and quantile signal (signal units,
    #: ascending): a quantile sample says only which bucket the quantile lies in
    buckets: dict[TargetKey, dict[Signal, tuple[float, ...]]] = field(default_factory=dict)
    #: the rate window the counters were read with, s (0: not recorded)
    rate_window_s: float = 0.0
    #: the scrape interval measured from the data, s (None: not measured)
    scrape_interval_s: float | None = None
    #: targets scraped slower than the fleet and the rate window their counters and
    #: histograms were re-read with, s (``core/scrape.slower_than_fleet``)
    target_rate_window_s: dict[TargetKey, float] = field(default_factory=dict)
    #: targets whose gauges were re-read without relabel leftovers (kvwatch.core.churn);
    #: None: not looked for
    leftovers: frozenset[TargetKey] | None = None

    def values(self, key: TargetKey, signal: Signal) -> np.ndarray | None:
        return self.series.get(key, {}).get(signal)

    def rate_window(self, key: TargetKey) -> float:
        """The rate window (s) ``key``'s counters were read with: its own where it is scraped
        slower than the fleet, else the fleet's (0: not recorded)."""
        return self.target_rate_window_s.get(key, self.rate_window_s)

    def put(self, key: TargetKey, signal: Signal, values: np.ndarray) -> None:
        self.series.setdefault(key, {})[signal] = values

    def to_frame(self) -> pd.DataFrame:
        """Tidy frame: one row per (target, signal, timestamp) with a finite value.

        Columns ``job``, ``instance``, ``signal``, ``ts`` (UTC datetimes), ``value``;
        gaps (NaN, ±Inf) have no row. Each (target, signal) becomes a Prometheus range
        vector and prometheus-api-client's :class:`MetricRangeDataFrame` tabulates them,
        so the frame has the shape that library gives any query_range answer.
        """
        vectors = []
        for key, sigs in self.series.items():
            for sig, vals in sigs.items():
                ok = np.isfinite(vals)
                if ok.any():
                    labels = {"job": key.job, "instance": key.instance, "signal": sig.value}
                    vectors.append({"metric": labels, "values": np.column_stack((self.grid[ok], vals[ok]))})
        if not vectors:
            return pd.DataFrame(columns=list(FRAME_COLUMNS))
        with warnings.catch_warnings():
            # the library calls set_index(inplace=True), deprecated by pandas 3.1: not ours to fix
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            frame = MetricRangeDataFrame(vectors, ts_as_datetime=False).reset_index()
        frame["ts"] = pd.to_datetime(frame["timestamp"].astype(float), unit="s", utc=True)
        frame["value"] = frame["value"].astype(float)
        return frame[list(FRAME_COLUMNS)]
