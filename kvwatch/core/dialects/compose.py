"""Building blocks of the per-engine source tables: kind shorthands, the TTFT trio, merging."""

from __future__ import annotations

from kvwatch.core.dialects.model import Source, SourceKind
from kvwatch.core.signals import Signal

G, C, HQ, HM, X = (
    SourceKind.GAUGE,
    SourceKind.COUNTER,
    SourceKind.HIST_QUANTILE,
    SourceKind.HIST_MEAN,
    SourceKind.EXPR,
)

QUEUE_BUCKET_NOTE = "lowest default bucket 0.3 s: queue times below are interpolated, not measured"


def ttft_sources(metric: str, matchers: str = "", scale: float = 1.0, **kw: object) -> dict[Signal, Source]:
    return {
        Signal.TTFT_P50: Source(HQ, metric, matchers, quantile=0.5, scale=scale, **kw),  # type: ignore[arg-type]
        Signal.TTFT_P99: Source(HQ, metric, matchers, quantile=0.99, scale=scale, **kw),  # type: ignore[arg-type]
        Signal.TTFT_MEAN: Source(HM, metric, matchers, scale=scale, **kw),  # type: ignore[arg-type]
    }


def merge_sources(*parts: dict[Signal, Source | tuple[Source, ...]]) -> dict[Signal, tuple[Source, ...]]:
    out: dict[Signal, tuple[Source, ...]] = {}
    for part in parts:
        for sig, src in part.items():
            srcs = src if isinstance(src, tuple) else (src,)
            out[sig] = out.get(sig, ()) + srcs
    return out
