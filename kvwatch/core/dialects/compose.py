"""Building blocks of the per-engine source tables: kind shorthands, the TTFT trio, merging."""

from __future__ import annotations

from kvwatch.core.dialects.model import BY, Render, Source, SourceKind, per_target_ratio
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


def request_time_per_token(
    e2e: str, tokens: str, matchers: str = "",
    note: str = "end-to-end request seconds / generated tokens (s per token, queue included)",
) -> Source:
    """``request_time_per_token`` from an end-to-end latency histogram (family ``e2e``) and a
    generated-tokens counter (``tokens``, as scraped): seconds of finished requests per token
    they generated. Read only where no TTFT is exported (:data:`~kvwatch.core.signals.ONLY_WITHOUT`),
    to tell a slow engine from an idle one. On the base variant of 54 corpora it read 0.09-2.1 s
    on compute-bound pools (all but 16 of 278 at or over the rule's 0.25 s) and 0.007-1.7 s on
    low-demand, healthy and misread ones (8 of 2,150 over it)."""
    def expr(r: Render) -> str:
        return per_target_ratio(request_seconds(r, e2e, matchers), f"rate({r.sel(tokens, matchers)}[{r.rw}])")

    return Source(X, f"{e2e}_sum", expr=expr, extra_requires=(tokens,), note=note)


def request_seconds(r: Render, e2e: str, matchers: str = "") -> str:
    """Seconds of finished requests per second, per series: the rate of an end-to-end latency
    histogram's ``_sum`` (family ``e2e``), the numerator of every request time per token."""
    return f"rate({r.sel(f'{e2e}_sum', matchers)}[{r.rw}])"


def queue_occupancy(metric: str, matchers: str = "", scale: float = 1.0, dedup_by: tuple[str, ...] = ()) -> Source:
    """``waiting`` estimated from a queue-time histogram when the queue gauge is absent.

    Little's law: the queue seconds that finished requests accrued per second
    (``rate(<metric>_sum)``) is the mean number of requests waiting over the rate
    window, in requests like the gauge. It lags by one request's run time where the
    engine observes queue time at request finish. No request finished in the window
    (a wedged scheduler, no traffic) says nothing about the queue, so the estimate is
    then absent (undecidable), never 0. ``dedup_by``: labels of the replicas to sum over when
    several ranks of one replica export the same histogram (SGLang's scheduler ranks): the
    rate is taken once per replica (max over its ranks), as for the gauges.
    """
    def expr(r: Render) -> str:
        total, count = (r.sel(f"{metric}{sfx}", matchers) for sfx in ("_sum", "_count"))
        rate = f"rate({total}[{r.rw}])"
        if dedup_by:
            rate = f"max by ({BY}, {', '.join(dedup_by)}) ({rate})"
        return (f"sum by ({BY}) ({rate}) "
                f"and on ({BY}) (sum by ({BY}) (rate({count}[{r.rw}])) > 0)")

    return Source(X, f"{metric}_sum", expr=expr, scale=scale, extra_requires=(f"{metric}_count",),
                  note="estimate by Little's law: queue seconds of finished requests per second",
                  estimate=("mean requests waiting over the rate window by Little's law: queue seconds of "
                            "finished requests per second; absent while no request finishes"))


def merge_sources(*parts: dict[Signal, Source | tuple[Source, ...]]) -> dict[Signal, tuple[Source, ...]]:
    out: dict[Signal, tuple[Source, ...]] = {}
    for part in parts:
        for sig, src in part.items():
            srcs = src if isinstance(src, tuple) else (src,)
            out[sig] = out.get(sig, ()) + srcs
    return out
