"""Engine dialects as data: which PromQL yields each canonical signal.

A *dialect* is one family of metric names (vLLM V1, vLLM V0, SGLang with ``sglang:``
or ``sglang_`` prefix, TensorRT-LLM under Triton, trtllm-serve). For every
canonical :class:`~kvwatch.core.signals.Signal` a dialect lists *sources* in order of
preference; per target the first source whose metric names Prometheus holds for
that target wins. This handles renames between engine versions
(``vllm:gpu_cache_usage_perc`` → ``vllm:kv_cache_usage_perc`` …) without a
version table. Names are as scraped (counters carry ``_total``); facts come from
``shared/engine-metrics.md``.

Every query aggregates ``by (job, instance)``: one series per target, whatever
the data-parallel (``engine``, ``dp_rank``) or process (``pid``) labels are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from kvwatch.core.signals import Signal

#: The labels that identify a target. Every query groups by exactly these.
TARGET_LABELS: tuple[str, ...] = ("job", "instance")
BY = ", ".join(TARGET_LABELS)


def selector(metric: str, *matchers: str) -> str:
    """``metric{m1, m2}`` from non-empty matcher strings (each without braces)."""
    parts = [m for m in matchers if m]
    return f"{metric}{{{', '.join(parts)}}}"


class SourceKind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HIST_QUANTILE = "histogram_quantile"
    HIST_MEAN = "histogram_mean"
    EXPR = "expr"
    VLLM_CACHE_INFO = "vllm_cache_info"


@dataclass(frozen=True)
class Source:
    """One way to compute a signal from an engine's metrics.

    ``metric`` is the scraped family name (histograms: without ``_bucket``);
    ``matchers`` are extra label matchers (without braces); ``agg`` is the
    cross-series aggregation (``max`` for ratios and per-model duplicates,
    ``sum`` for counts over data-parallel engines); ``scale`` converts units
    (e.g. ms → s). ``EXPR`` sources build their PromQL with ``expr(sel, rw)``
    where ``sel(metric, matchers)`` renders a selector that includes the
    user's matchers and ``rw`` is the rate window.
    """

    kind: SourceKind
    metric: str
    matchers: str = ""
    agg: str = "max"
    quantile: float = 0.0
    scale: float = 1.0
    expr: Callable[[Callable[[str, str], str], str], str] | None = None
    extra_requires: tuple[str, ...] = ()
    #: for a fallback: how it yields the signal in the signal's one unit (e.g. tokens/s from
    #: decode requests per iteration x iterations per second); shown by explain/check
    estimate: str = ""

    @property
    def requires(self) -> tuple[str, ...]:
        """Metric names that must be present on a target for this source to apply."""
        base = self.metric
        if self.kind in (SourceKind.HIST_QUANTILE, SourceKind.HIST_MEAN):
            base = f"{self.metric}_count"
        return (base, *self.extra_requires)

    def _sel(self, suffix: str, user: str) -> str:
        return selector(f"{self.metric}{suffix}", self.matchers, user)

    def promql(self, user_matchers: str, rate_window: str, latency_window: str | None = None) -> str:
        """Render the PromQL that yields this signal for every target at once.

        Histogram quantiles and means use ``latency_window`` when given (a stable tail
        needs more requests than a short rate window holds), counters ``rate_window``.
        """
        k = self.kind
        if latency_window and k in (SourceKind.HIST_QUANTILE, SourceKind.HIST_MEAN):
            rate_window = latency_window
        if k is SourceKind.GAUGE:
            q = f"{self.agg} by ({BY}) ({self._sel('', user_matchers)})"
        elif k is SourceKind.COUNTER:
            q = f"{self.agg} by ({BY}) (rate({self._sel('', user_matchers)}[{rate_window}]))"
        elif k is SourceKind.HIST_QUANTILE:
            inner = f"rate({self._sel('_bucket', user_matchers)}[{rate_window}])"
            q = f"histogram_quantile({self.quantile}, sum by ({BY}, le) ({inner}))"
        elif k is SourceKind.HIST_MEAN:
            num = f"sum by ({BY}) (rate({self._sel('_sum', user_matchers)}[{rate_window}]))"
            den = f"sum by ({BY}) (rate({self._sel('_count', user_matchers)}[{rate_window}]))"
            q = f"{num} / {den}"
        elif k is SourceKind.VLLM_CACHE_INFO:
            labels = "num_gpu_blocks, block_size, kv_cache_size_tokens"
            q = f"max by ({BY}, {labels}) ({self._sel('', user_matchers)})"
        else:
            assert self.expr is not None, f"EXPR source {self.metric} without expr"
            q = self.expr(lambda name, extra: selector(name, extra, user_matchers), rate_window)
        if self.scale != 1.0 and k is not SourceKind.VLLM_CACHE_INFO:
            q = f"({q}) * {self.scale!r}"
        return q


@dataclass(frozen=True)
class Dialect:
    """A family of metric names: its id, engine, how to recognise it, and its sources."""

    id: str
    engine: str
    markers: tuple[str, ...]
    sources: dict[Signal, tuple[Source, ...]] = field(default_factory=dict)
    required_label: str = ""

    def names(self) -> set[str]:
        out = set(self.markers)
        for srcs in self.sources.values():
            for s in srcs:
                out.update(s.requires)
        return out


G, C, HQ, HM, X = (
    SourceKind.GAUGE,
    SourceKind.COUNTER,
    SourceKind.HIST_QUANTILE,
    SourceKind.HIST_MEAN,
    SourceKind.EXPR,
)


def _latency(metric: str, matchers: str = "", scale: float = 1.0) -> dict[Signal, Source]:
    return {
        Signal.TTFT_P50: Source(HQ, metric, matchers, quantile=0.5, scale=scale),
        Signal.TTFT_P99: Source(HQ, metric, matchers, quantile=0.99, scale=scale),
        Signal.TTFT_MEAN: Source(HM, metric, matchers, scale=scale),
    }


def _merge(*parts: dict[Signal, Source | tuple[Source, ...]]) -> dict[Signal, tuple[Source, ...]]:
    out: dict[Signal, tuple[Source, ...]] = {}
    for part in parts:
        for sig, src in part.items():
            srcs = src if isinstance(src, tuple) else (src,)
            out[sig] = out.get(sig, ()) + srcs
    return out


# vLLM: `model_name!=""` keeps the production-stack router's look-alike series
# (label `server`, no `model_name`) out; cache_config_info carries no model_name.
_VM = 'model_name!=""'
VLLM_SOURCES = _merge(
    {
        Signal.KV_USAGE: (
            Source(G, "vllm:kv_cache_usage_perc", _VM),
            Source(G, "vllm:gpu_cache_usage_perc", _VM),
        ),
        Signal.RUNNING: Source(G, "vllm:num_requests_running", _VM, agg="sum"),
        Signal.WAITING: Source(G, "vllm:num_requests_waiting", _VM, agg="sum"),
        Signal.WAITING_CAPACITY: Source(
            G, "vllm:num_requests_waiting_by_reason", f'{_VM}, reason="capacity"', agg="sum"
        ),
        Signal.PREEMPTIONS: Source(C, "vllm:num_preemptions_total", _VM, agg="sum"),
        Signal.QUEUE_P99: Source(HQ, "vllm:request_queue_time_seconds", _VM, quantile=0.99),
        Signal.QUEUE_MEAN: Source(HM, "vllm:request_queue_time_seconds", _VM),
        Signal.ITL_P99: (
            Source(HQ, "vllm:inter_token_latency_seconds", _VM, quantile=0.99),
            Source(HQ, "vllm:time_per_output_token_seconds", _VM, quantile=0.99),
        ),
        Signal.GEN_TPS: (
            Source(C, "vllm:generation_tokens_total", _VM, agg="sum"),
            Source(C, "vllm:request_generation_tokens_sum", _VM, agg="sum",
                   estimate="tokens/s counted when requests finish (per-request histogram sum)"),
        ),
        Signal.PROMPT_TPS: (
            Source(C, "vllm:prompt_tokens_total", _VM, agg="sum"),
            Source(C, "vllm:request_prompt_tokens_sum", _VM, agg="sum",
                   estimate="tokens/s counted when requests finish (per-request histogram sum)"),
        ),
        Signal.REQUEST_RATE: (
            Source(C, "vllm:request_success_total", _VM, agg="sum"),
            Source(C, "vllm:e2e_request_latency_seconds_count", _VM, agg="sum",
                   estimate="finished requests/s from the end-to-end latency histogram count"),
        ),
        Signal.ABORT_RATE: Source(
            C, "vllm:request_success_total", f'{_VM}, finished_reason=~"abort|error"', agg="sum"
        ),
        Signal.KV_CAPACITY_TOKENS: Source(SourceKind.VLLM_CACHE_INFO, "vllm:cache_config_info"),
    },
    _latency("vllm:time_to_first_token_seconds", _VM),
)


#: labels that tell apart the scheduler ranks of ONE SGLang replica: with
#: enable_metrics_for_all_schedulers every TP/PP/EP rank exports the same batch (the
#: real exporter, tests/fixtures/conformance), so counts are taken once per replica
#: (max over its ranks) and only then summed over replicas (dp_rank) and models.
_SGLANG_RANKS = "tp_rank, pp_rank, moe_ep_rank, pid"


def _sglang_count(metric: str, matchers: str) -> Source:
    """A per-scheduler count (running, queued): max over ranks, sum over replicas."""
    return Source(
        X,
        metric,
        matchers,
        agg="sum",
        expr=lambda sel, rw: f"sum by ({BY}) (max without ({_SGLANG_RANKS}) ({sel(metric, matchers)}))",
    )


def _sglang(p: str) -> dict[Signal, tuple[Source, ...]]:
    # `priority=""` selects the totals when priority scheduling adds per-priority series.
    pr = 'priority=""'
    def cap_expr(sel: Callable[[str, str], str], rw: str) -> str:
        return f"max by ({BY}) ({sel(p + 'num_used_tokens', pr)} / ({sel(p + 'token_usage', pr)} > 0.05))"

    return _merge(
        {
            Signal.KV_USAGE: Source(G, f"{p}token_usage", pr),
            Signal.RUNNING: _sglang_count(f"{p}num_running_reqs", pr),
            Signal.WAITING: _sglang_count(f"{p}num_queue_reqs", pr),
            Signal.PREEMPTIONS: (
                Source(C, f"{p}num_retracted_requests_total", agg="sum"),
                Source(G, f"{p}num_retracted_reqs", agg="sum"),
                Source(G, f"{p}total_retracted_reqs", agg="sum"),
            ),
            Signal.QUEUE_P99: Source(HQ, f"{p}queue_time_seconds", quantile=0.99),
            Signal.QUEUE_MEAN: (
                Source(HM, f"{p}queue_time_seconds"),
                Source(G, f"{p}avg_request_queue_latency"),
            ),
            Signal.ITL_P99: (
                Source(HQ, f"{p}inter_token_latency_seconds", quantile=0.99),
                Source(HQ, f"{p}time_per_output_token_seconds", quantile=0.99),
            ),
            Signal.GEN_TPS: (
                Source(C, f"{p}generation_tokens_total", agg="sum"),
                Source(G, f"{p}gen_throughput", pr, agg="sum",
                       estimate="the scheduler's decode throughput gauge, tokens/s"),
            ),
            Signal.PROMPT_TPS: Source(C, f"{p}prompt_tokens_total", agg="sum"),
            Signal.REQUEST_RATE: (
                Source(C, f"{p}num_requests_total", agg="sum"),
                Source(C, f"{p}e2e_request_latency_seconds_count", agg="sum",
                       estimate="finished requests/s from the end-to-end latency histogram count"),
            ),
            Signal.ABORT_RATE: Source(C, f"{p}num_aborted_requests_total", agg="sum"),
            Signal.KV_CAPACITY_TOKENS: (
                Source(G, f"{p}max_total_num_tokens"),
                Source(X, f"{p}num_used_tokens", expr=cap_expr, extra_requires=(f"{p}token_usage",)),
            ),
        },
        _latency(f"{p}time_to_first_token_seconds"),
    )


_TB = "nv_trt_llm_kv_cache_block_metrics"
_IFB = "nv_trt_llm_inflight_batcher_metrics"
_GEN = "nv_trt_llm_general_metrics"


def _per_iteration(kind: str, estimate: str) -> Source:
    """Triton without the ``nv_llm_*`` token histograms: a per-iteration gauge of the in-flight
    batcher times iterations per second (the iteration counter is a gauge that only grows, so
    ``rate`` reads it; a restart is a counter reset)."""
    which = f'inflight_batcher_specific_metric="{kind}"'
    counter = 'general_type="iteration_counter"'

    def expr(sel: Callable[[str, str], str], rw: str) -> str:
        per_iter = f"avg_over_time({sel(_IFB, which)}[{rw}])"
        iters = f"rate({sel(_GEN, counter)}[{rw}])"
        return f"sum by ({BY}) ({per_iter}) * on ({BY}) max by ({BY}) ({iters})"

    return Source(X, _IFB, expr=expr, extra_requires=(_GEN,), estimate=estimate)


_TR = "nv_trt_llm_request_metrics"
_WAITING = 'request_type="waiting"'
_MAXB = 'kv_cache_block_type="max"'
_TPB = 'kv_cache_block_type="tokens_per"'
TRITON_SOURCES = _merge(
    {
        Signal.KV_USAGE: Source(G, _TB, 'kv_cache_block_type="fraction"'),
        Signal.RUNNING: Source(G, _TR, 'request_type="scheduled"', agg="sum"),
        Signal.WAITING: (
            Source(
                X,
                _TR,
                expr=lambda sel, rw: (
                    f"sum by ({BY}) ({sel(_TR, _WAITING)}) + on ({BY}) "
                    f'max by ({BY}) ({sel("nv_inference_pending_request_count", "")})'
                ),
                extra_requires=("nv_inference_pending_request_count",),
            ),
            Source(G, _TR, 'request_type="waiting"', agg="sum"),
        ),
        Signal.PREEMPTIONS: Source(
            G,
            "nv_trt_llm_inflight_batcher_metrics",
            'inflight_batcher_specific_metric="paused_requests"',
            agg="sum",
        ),
        Signal.QUEUE_MEAN: Source(
            X,
            "nv_inference_queue_duration_us",
            expr=lambda sel, rw: (
                f'max by ({BY}) (rate({sel("nv_inference_queue_duration_us", "")}[{rw}])) '
                f'/ max by ({BY}) (rate({sel("nv_inference_request_success", "")}[{rw}])) / 1e6'
            ),
            extra_requires=("nv_inference_request_success",),
        ),
        Signal.GEN_TPS: (
            Source(C, "nv_llm_output_token_len_sum", agg="sum"),
            _per_iteration("generation_requests", "decode requests per iteration x iterations/s = tokens/s"),
        ),
        Signal.PROMPT_TPS: (
            Source(C, "nv_llm_input_token_len_sum", agg="sum"),
            _per_iteration("total_context_tokens", "context tokens per iteration x iterations/s = tokens/s"),
        ),
        Signal.REQUEST_RATE: (
            Source(C, "nv_inference_request_success", agg="max"),
            Source(C, "nv_inference_count", agg="max", estimate="inferences/s (one per request for LLM models)"),
        ),
        Signal.ABORT_RATE: Source(C, "nv_inference_request_failure", agg="max"),
        Signal.KV_CAPACITY_TOKENS: Source(
            X,
            _TB,
            expr=lambda sel, rw: (
                f"max by ({BY}) ({sel(_TB, _MAXB)}) * on ({BY}) "
                f"max by ({BY}) ({sel(_TB, _TPB)})"
            ),
        ),
        Signal.MAX_RUNNING: Source(G, _TR, 'request_type="max"'),
    },
    # Triton's own first-response histogram exists only with histogram_latencies=true (ms).
    _latency("nv_inference_first_response_histogram_ms", scale=0.001),
)


def _trtllm_serve(p: str, m: str) -> dict[Signal, tuple[Source, ...]]:
    latency = _merge(
        _latency(f"{p}time_to_first_token_seconds", m),
        {
            Signal.QUEUE_P99: Source(HQ, f"{p}request_queue_time_seconds", m, quantile=0.99),
            Signal.QUEUE_MEAN: Source(HM, f"{p}request_queue_time_seconds", m),
            Signal.ITL_P99: Source(HQ, f"{p}time_per_output_token_seconds", m, quantile=0.99),
            Signal.REQUEST_RATE: Source(C, f"{p}request_success_total", m, agg="sum"),
        },
    )
    if not p:  # generation A: only the five latency/request families exist
        return latency
    return _merge(
        latency,
        {
            Signal.KV_USAGE: Source(G, f"{p}kv_cache_utilization"),
            Signal.RUNNING: (
                Source(G, f"{p}num_scheduled_requests", agg="sum"),
                Source(G, f"{p}num_requests_running", agg="sum"),
            ),
            Signal.WAITING: (
                # queued in the executor plus active-but-unscheduled (waiting for KV blocks
                # or a wedged scheduler): the same reading as Triton's request_type="waiting"
                Source(
                    X,
                    f"{p}num_requests_waiting",
                    expr=lambda sel, rw: (
                        f"sum by ({BY}) ({sel(p + 'num_requests_waiting', '')}) + on ({BY}) "
                        f"clamp_min(sum by ({BY}) ({sel(p + 'num_requests_running', '')}) - on ({BY}) "
                        f"sum by ({BY}) ({sel(p + 'num_scheduled_requests', '')}), 0)"
                    ),
                    extra_requires=(f"{p}num_requests_running", f"{p}num_scheduled_requests"),
                ),
                Source(G, f"{p}num_requests_waiting", agg="sum"),
            ),
            Signal.PREEMPTIONS: Source(G, f"{p}num_paused_requests", agg="sum"),
            Signal.GEN_TPS: Source(C, f"{p}generation_tokens_total", agg="sum"),
            Signal.PROMPT_TPS: Source(C, f"{p}prompt_tokens_total", agg="sum"),
            Signal.ABORT_RATE: (
                Source(C, f"{p}request_error_total", agg="sum"),
                Source(C, f"{p}request_success_total", 'finished_reason="abort"', agg="sum"),
            ),
            Signal.KV_CAPACITY_TOKENS: Source(
                X,
                f"{p}kv_cache_max_blocks",
                expr=lambda sel, rw: (
                    f"max by ({BY}) ({sel(p + 'kv_cache_max_blocks', '')}) * on ({BY}) "
                    f"max by ({BY}) ({sel(p + 'kv_cache_tokens_per_block', '')})"
                ),
                extra_requires=(f"{p}kv_cache_tokens_per_block",),
            ),
            Signal.MAX_RUNNING: Source(G, f"{p}max_num_active_requests"),
        },
    )


#: All dialects, in detection priority order (first match wins for a target).
DIALECTS: tuple[Dialect, ...] = (
    Dialect(
        "vllm-v0",
        "vllm",
        ("vllm:num_requests_swapped", "vllm:cpu_cache_usage_perc", "vllm:avg_generation_throughput_toks_per_s"),
        VLLM_SOURCES,
    ),
    Dialect("vllm-v1", "vllm", ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), VLLM_SOURCES),
    Dialect("sglang", "sglang", ("sglang:num_running_reqs", "sglang:token_usage"), _sglang("sglang:")),
    Dialect("sglang-underscore", "sglang", ("sglang_num_running_reqs", "sglang_token_usage"), _sglang("sglang_")),
    Dialect("trtllm-triton", "trtllm", (_TB, _TR), TRITON_SOURCES),
    Dialect("trtllm-serve", "trtllm", ("trtllm_kv_cache_utilization", "trtllm_num_requests_running", "trtllm_time_to_first_token_seconds_count"), _trtllm_serve("trtllm_", "")),
    Dialect(
        "trtllm-serve-legacy",
        "trtllm",
        ("time_to_first_token_seconds_count", "request_success_total"),
        _trtllm_serve("", 'engine_type!=""'),
        required_label="engine_type",
    ),
)

DIALECT_BY_ID: dict[str, Dialect] = {d.id: d for d in DIALECTS}


def all_names() -> list[str]:
    """Every metric name any dialect needs, sorted: the discovery query asks for exactly these."""
    out: set[str] = set()
    for d in DIALECTS:
        out |= d.names()
    return sorted(out)
