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


#: Labels that identify one Triton model's series; core metrics are matched on them.
TRITON_MODEL_LABELS = ("model", "version")
#: The series that mark a Triton model as the TensorRT-LLM one (only that backend exports it).
TRITON_LLM_MARKER = "nv_trt_llm_request_metrics"


@dataclass(frozen=True)
class Render:
    """What a source needs besides its own fields to render PromQL.

    ``user`` are the user's matchers (without braces), ``rw`` the window,
    ``triton_model`` a regex of the Triton model name(s) holding the LLM (empty:
    the models that export ``nv_trt_llm_*``, found by a join).
    """

    user: str
    rw: str
    triton_model: str = ""

    def sel(self, metric: str, extra: str = "") -> str:
        return selector(metric, extra, self.user)

    def llm(self, vector: str, scoped: bool = True) -> str:
        """``vector`` restricted to the Triton LLM model (identity when ``scoped`` is false).

        With an explicit ``triton_model`` the selectors already carry the model
        matcher; otherwise keep only series of a (model, version) that also exports
        the TensorRT-LLM backend's own metrics, so ensemble/pre/post-processing
        models never mix into sums, maxima or ratios.
        """
        if not scoped or self.triton_model:
            return vector
        on = ", ".join((*TARGET_LABELS, *TRITON_MODEL_LABELS))
        return f"({vector} and on ({on}) group by ({on}) ({self.sel(TRITON_LLM_MARKER)}))"


@dataclass(frozen=True)
class Source:
    """One way to compute a signal from an engine's metrics.

    ``metric`` is the scraped family name (histograms: without ``_bucket``);
    ``matchers`` are extra label matchers (without braces); ``agg`` is the
    cross-series aggregation (``max`` for ratios and per-model duplicates,
    ``sum`` for counts over data-parallel engines); ``dedup_by`` first collapses
    duplicate series with ``max`` keeping those labels (SGLang exports the same
    scheduler state once per tensor-parallel rank: ``max by (dp_rank)`` then
    ``sum``); ``scale`` converts units (e.g. ms → s). ``EXPR`` sources build their
    PromQL with ``expr(r)`` from a :class:`Render`.

    ``lazy_anchor``: the engine creates this counter's series only at its first
    event; the source then requires the always-present ``lazy_anchor`` metric
    instead, and an absent counter reads 0 (so the source choice never flips
    when the first event happens). ``triton_core``: a Triton core metric
    (``nv_inference_*``) carried by every model of the server; it is restricted
    to the LLM model. ``bucket_range``: the default lowest and highest finite
    histogram bounds in the signal's unit (a quantile outside is interpolation
    or saturation, not measurement). ``note``: meaning and caveats (docs/engines.md).
    ``proxy``: non-empty when the source only approximates the signal (what it really
    measures); everything that shows the value says so.
    """

    kind: SourceKind
    metric: str
    matchers: str = ""
    agg: str = "max"
    quantile: float = 0.0
    scale: float = 1.0
    expr: Callable[[Render], str] | None = None
    extra_requires: tuple[str, ...] = ()
    dedup_by: tuple[str, ...] = ()
    lazy_anchor: str = ""
    triton_core: bool = False
    bucket_range: tuple[float, float] | None = None
    note: str = ""
    proxy: str = ""
    #: for a fallback: how it yields the signal in the signal's one unit (e.g. tokens/s from
    #: decode requests per iteration x iterations per second); shown by explain/check
    estimate: str = ""

    @property
    def requires(self) -> tuple[str, ...]:
        """Metric names that must be present on a target for this source to apply."""
        base = self.lazy_anchor or self.metric
        if not self.lazy_anchor and self.kind in (SourceKind.HIST_QUANTILE, SourceKind.HIST_MEAN):
            base = f"{self.metric}_count"
        return (base, *self.extra_requires)

    @property
    def family_names(self) -> tuple[str, ...]:
        """Every engine family this source reads (histograms by family name)."""
        return tuple(dict.fromkeys((self.metric, *([self.lazy_anchor] if self.lazy_anchor else []),
                                    *self.extra_requires)))

    def _sel(self, suffix: str, r: Render) -> str:
        extra = self.matchers
        if self.triton_core and r.triton_model:
            extra = ", ".join(m for m in (extra, f'model=~"{r.triton_model}"') if m)
        return selector(f"{self.metric}{suffix}", extra, r.user)

    def _aggregate(self, inner: str) -> str:
        if self.dedup_by:
            inner = f"max by ({BY}, {', '.join(self.dedup_by)}) ({inner})"
        return f"{self.agg} by ({BY}) ({inner})"

    def promql(
        self, user_matchers: str, rate_window: str, latency_window: str | None = None, triton_model: str = ""
    ) -> str:
        """Render the PromQL that yields this signal for every target at once.

        Histogram quantiles and means use ``latency_window`` when given (a stable tail
        needs more requests than a short rate window holds), counters ``rate_window``.
        ``triton_model``: regex of the Triton LLM model (empty: found by a join).
        """
        k = self.kind
        if latency_window and k in (SourceKind.HIST_QUANTILE, SourceKind.HIST_MEAN):
            rate_window = latency_window
        r = Render(user_matchers, rate_window, triton_model)
        scoped = self.triton_core
        if k is SourceKind.GAUGE:
            q = self._aggregate(r.llm(self._sel("", r), scoped))
        elif k is SourceKind.COUNTER:
            q = self._aggregate(r.llm(f"rate({self._sel('', r)}[{rate_window}])", scoped))
        elif k is SourceKind.HIST_QUANTILE:
            inner = r.llm(f"rate({self._sel('_bucket', r)}[{rate_window}])", scoped)
            q = f"histogram_quantile({self.quantile}, sum by ({BY}, le) ({inner}))"
        elif k is SourceKind.HIST_MEAN:
            # numerator and denominator over the same series (same model, same filter)
            num, den = (r.llm(f"rate({self._sel(sfx, r)}[{rate_window}])", scoped) for sfx in ("_sum", "_count"))
            q = f"sum by ({BY}) ({num}) / sum by ({BY}) ({den})"
        elif k is SourceKind.VLLM_CACHE_INFO:
            # per engine: with data parallelism every engine core has its own pool
            labels = "engine, num_gpu_blocks, block_size, kv_cache_size_tokens"
            q = f"max by ({BY}, {labels}) ({self._sel('', r)})"
        else:
            assert self.expr is not None, f"EXPR source {self.metric} without expr"
            q = self.expr(r)
        if self.scale != 1.0 and k is not SourceKind.VLLM_CACHE_INFO:
            q = f"({q}) * {self.scale!r}"
        if self.lazy_anchor:
            q = f"({q}) or (0 * group by ({BY}) ({selector(self.lazy_anchor, '', user_matchers)}))"
        return q


@dataclass(frozen=True)
class Dialect:
    """A family of metric names: its id, engine, how to recognise it, and its sources.

    ``model_pattern``: the dialect applies only when a discovered ``model`` label
    fully matches this regex (Triton core metrics alone say nothing about the
    backend). ``blind_reason``: why a recognised target of this dialect cannot be
    diagnosed (shown instead of "kv_usage is not exported"). ``versions`` and
    ``upstream`` (file@commit or release) feed docs/engines.md. ``defer_to``: engines
    whose own metrics win when a target exports both (a Dynamo worker re-exporting
    vLLM's metrics is a vLLM target, counted once).
    """

    id: str
    engine: str
    markers: tuple[str, ...]
    sources: dict[Signal, tuple[Source, ...]] = field(default_factory=dict)
    required_label: str = ""
    model_pattern: str = ""
    blind_reason: str = ""
    versions: str = ""
    upstream: str = ""
    defer_to: tuple[str, ...] = ()

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

_Q03 = "lowest default bucket 0.3 s: queue times below are interpolated, not measured"


def _latency(metric: str, matchers: str = "", scale: float = 1.0, **kw: object) -> dict[Signal, Source]:
    return {
        Signal.TTFT_P50: Source(HQ, metric, matchers, quantile=0.5, scale=scale, **kw),  # type: ignore[arg-type]
        Signal.TTFT_P99: Source(HQ, metric, matchers, quantile=0.99, scale=scale, **kw),  # type: ignore[arg-type]
        Signal.TTFT_MEAN: Source(HM, metric, matchers, scale=scale, **kw),  # type: ignore[arg-type]
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


def _vllm(p: str, total: str = "_total") -> dict[Signal, tuple[Source, ...]]:
    """vLLM V1/V0 names with prefix ``p`` (``vllm:`` natively, ``ray_vllm_`` through Ray).

    ``total`` is the suffix of counters as scraped (prometheus_client always adds
    ``_total``; Ray's exporter too, older Ray versions did not).
    """
    return _merge(
        {
            Signal.KV_USAGE: (
                Source(G, f"{p}kv_cache_usage_perc", _VM,
                       note="blocks held by running requests / pool; evictable prefix-cache blocks count as free"),
                Source(G, f"{p}gpu_cache_usage_perc", _VM,
                       note="old name (<= 0.10.x; 0.11.x only with --show-hidden-metrics-for-version=0.10)"),
            ),
            Signal.RUNNING: Source(G, f"{p}num_requests_running", _VM, agg="sum"),
            Signal.WAITING: Source(G, f"{p}num_requests_waiting", _VM, agg="sum",
                                   note=">= 0.20.2: capacity-waiting + deferred"),
            Signal.WAITING_CAPACITY: Source(
                G, f"{p}num_requests_waiting_by_reason", f'{_VM}, reason="capacity"', agg="sum"
            ),
            Signal.PREEMPTIONS: Source(C, f"{p}num_preemptions{total}", _VM, agg="sum"),
            Signal.QUEUE_P99: Source(HQ, f"{p}request_queue_time_seconds", _VM, quantile=0.99,
                                     bucket_range=(0.3, 7680.0), note=_Q03 + "; observed at request finish"),
            Signal.QUEUE_MEAN: Source(HM, f"{p}request_queue_time_seconds", _VM),
            Signal.ITL_P99: (
                Source(HQ, f"{p}inter_token_latency_seconds", _VM, quantile=0.99, bucket_range=(0.01, 80.0),
                       note="one observation per output step (>= 0.10.2)"),
                Source(HQ, f"{p}time_per_output_token_seconds", _VM, quantile=0.99, bucket_range=(0.01, 80.0),
                       note="old name of the same per-step observations (<= 0.11.x, hidden 0.12-0.14)"),
            ),
            Signal.TPOT_P99: Source(HQ, f"{p}request_time_per_output_token_seconds", _VM, quantile=0.99,
                                    bucket_range=(0.01, 80.0), note="per finished request (>= 0.11.0)"),
            Signal.GEN_TPS: (
                Source(C, f"{p}generation_tokens{total}", _VM, agg="sum"),
                Source(C, f"{p}request_generation_tokens_sum", _VM, agg="sum",
                       estimate="tokens/s counted when requests finish (per-request histogram sum)"),
            ),
            Signal.PROMPT_TPS: (
                Source(C, f"{p}prompt_tokens{total}", _VM, agg="sum", note="includes prefix-cached tokens"),
                Source(C, f"{p}request_prompt_tokens_sum", _VM, agg="sum",
                       estimate="tokens/s counted when requests finish (per-request histogram sum)"),
            ),
            Signal.REQUEST_RATE: (
                Source(C, f"{p}request_success{total}", _VM, agg="sum", note="every finished request, aborts included"),
                Source(C, f"{p}e2e_request_latency_seconds_count", _VM, agg="sum",
                       estimate="finished requests/s from the end-to-end latency histogram count"),
            ),
            Signal.ABORT_RATE: Source(
                C, f"{p}request_success{total}", f'{_VM}, finished_reason=~"abort|error"', agg="sum"
            ),
            Signal.KV_CAPACITY_TOKENS: Source(
                SourceKind.VLLM_CACHE_INFO, f"{p}cache_config_info",
                note="kv_cache_size_tokens (>= 0.24) else num_gpu_blocks x block_size, per engine, summed",
            ),
        },
        _latency(f"{p}time_to_first_token_seconds", _VM, bucket_range=(0.001, 2560.0)),
    )


VLLM_SOURCES = _vllm("vllm:")


#: labels that tell apart the scheduler ranks of ONE SGLang replica: with
#: enable_metrics_for_all_schedulers every TP/PP/EP rank exports the same batch (the
#: real exporter, tests/fixtures/conformance), so counts are taken once per replica
#: (max over its ranks) and only then summed over replicas (dp_rank) and models.
def _sglang(p: str) -> dict[Signal, tuple[Source, ...]]:
    """SGLang (``sglang:``; ``ray_sglang_`` through Ray Serve).

    Scheduler gauges carry ``tp_rank``/``pp_rank`` (+ ``dp_rank``): by default only
    attention-TP rank 0 exports them, with ``enable_metrics_for_all_schedulers``
    every rank does (same state): ``max by (dp_rank)`` then ``sum`` counts each
    data-parallel scheduler once. ``priority=""`` selects the totals when priority
    scheduling adds per-priority series.
    """
    pr = 'priority=""'
    dp = ("dp_rank",)
    anchor = f"{p}num_running_reqs"

    def pool_sum(r: Render) -> str:
        parts = [f"max by ({BY}, dp_rank) ({r.sel(p + n)})" for n in
                 ("kv_available_tokens", "kv_evictable_tokens", "kv_used_tokens")]
        return f"sum by ({BY}) ({' + '.join(parts)})"

    def ratio(r: Render) -> str:
        return f"max by ({BY}) ({r.sel(p + 'num_used_tokens', pr)} / ({r.sel(p + 'token_usage', pr)} > 0.05))"

    return _merge(
        {
            Signal.KV_USAGE: Source(G, f"{p}token_usage", pr,
                                    note="max over full/SWA/Mamba pools, rounded to 0.01; radix-cached tokens count as free"),
            Signal.RUNNING: Source(G, f"{p}num_running_reqs", pr, agg="sum", dedup_by=dp),
            Signal.WAITING: Source(G, f"{p}num_queue_reqs", pr, agg="sum", dedup_by=dp),
            Signal.PREEMPTIONS: (
                # >= 0.5.10, created at the first retraction: anchored on a gauge of the same releases
                Source(C, f"{p}num_retracted_requests_total", agg="sum", dedup_by=dp,
                       lazy_anchor=f"{p}max_total_num_tokens",
                       note="retractions (KV full, request requeued) per second (>= 0.5.10)"),
                Source(C, f"{p}total_retracted_reqs", agg="sum", dedup_by=dp,
                       note="cumulative total stored in a gauge (0.4.10-0.5.x): read through rate()"),
            ),
            Signal.QUEUE_P99: Source(HQ, f"{p}queue_time_seconds", quantile=0.99),
            Signal.QUEUE_MEAN: (
                Source(HM, f"{p}queue_time_seconds"),
                Source(G, f"{p}avg_request_queue_latency", note="last batch only (0.4.6-0.5.1)"),
            ),
            Signal.ITL_P99: (
                Source(HQ, f"{p}inter_token_latency_seconds", quantile=0.99, bucket_range=(0.002, 8.0)),
                Source(HQ, f"{p}time_per_output_token_seconds", quantile=0.99),
            ),
            Signal.TPOT_P99: Source(HQ, f"{p}request_time_per_output_token_seconds", quantile=0.99,
                                    note="per finished request (0.5.23)"),
            Signal.GEN_TPS: (
                Source(C, f"{p}generation_tokens_total", agg="sum"),
                Source(G, f"{p}gen_throughput", pr, agg="sum", dedup_by=dp,
                       estimate="the scheduler's decode throughput gauge, tokens/s"),
            ),
            Signal.PROMPT_TPS: Source(C, f"{p}prompt_tokens_total", agg="sum"),
            Signal.REQUEST_RATE: (
                Source(C, f"{p}num_requests_total", agg="sum"),
                Source(C, f"{p}e2e_request_latency_seconds_count", agg="sum",
                       estimate="finished requests/s from the end-to-end latency histogram count"),
            ),
            Signal.ABORT_RATE: Source(C, f"{p}num_aborted_requests_total", agg="sum", lazy_anchor=anchor,
                                      note="created at the first abort: absent reads 0"),
            Signal.KV_CAPACITY_TOKENS: (
                Source(G, f"{p}max_total_num_tokens", dedup_by=dp, agg="sum", note=">= 0.5.10, set once"),
                Source(X, f"{p}kv_available_tokens", expr=pool_sum,
                       extra_requires=(f"{p}kv_evictable_tokens", f"{p}kv_used_tokens"),
                       note="available + evictable + used token slots (>= 0.5.15)"),
                Source(X, f"{p}num_used_tokens", expr=ratio, extra_requires=(f"{p}token_usage",),
                       note="last resort: used / usage, usage rounded to 0.01"),
            ),
        },
        _latency(f"{p}time_to_first_token_seconds", bucket_range=(0.1, 400.0)),
    )


_TB = "nv_trt_llm_kv_cache_block_metrics"
_TR = TRITON_LLM_MARKER
_WAITING = 'request_type="waiting"'
_MAXB = 'kv_cache_block_type="max"'
_TPB = 'kv_cache_block_type="tokens_per"'
_PAUSED = 'inflight_batcher_specific_metric="paused_requests"'
_ITER = 'general_type="iteration_counter"'
_IGNORE = "inflight_batcher_specific_metric, general_type"


def _triton_waiting(r: Render) -> str:
    pending = r.llm(r.sel("nv_inference_pending_request_count",
                          f'model=~"{r.triton_model}"' if r.triton_model else ""))
    return f"sum by ({BY}) ({r.sel(_TR, _WAITING)}) + on ({BY}) sum by ({BY}) ({pending})"


def _triton_preemptions(r: Render) -> str:
    # paused requests per iteration (mean over the window) x iterations per second
    return (f"sum by ({BY}) (avg_over_time({r.sel('nv_trt_llm_inflight_batcher_metrics', _PAUSED)}[{r.rw}]) "
            f"* ignoring ({_IGNORE}) rate({r.sel('nv_trt_llm_general_metrics', _ITER)}[{r.rw}]))")


def _triton_queue_mean(r: Render) -> str:
    m = f'model=~"{r.triton_model}"' if r.triton_model else ""
    num = r.llm(f"rate({r.sel('nv_inference_queue_duration_us', m)}[{r.rw}])")
    den = r.llm(f"rate({r.sel('nv_inference_request_success', m)}[{r.rw}])")
    return f"sum by ({BY}) ({num}) / sum by ({BY}) ({den}) / 1e6"


_IFB = "nv_trt_llm_inflight_batcher_metrics"
_GEN = "nv_trt_llm_general_metrics"


def _per_iteration(kind: str, estimate: str) -> Source:
    """Triton without the ``nv_llm_*`` token histograms: a per-iteration gauge of the in-flight
    batcher times iterations per second (the iteration counter is a gauge that only grows, so
    ``rate`` reads it; a restart is a counter reset)."""
    which = f'inflight_batcher_specific_metric="{kind}"'
    counter = 'general_type="iteration_counter"'

    def expr(r: Render) -> str:
        per_iter = f"avg_over_time({r.sel(_IFB, which)}[{r.rw}])"
        iters = f"rate({r.sel(_GEN, counter)}[{r.rw}])"
        return f"sum by ({BY}) ({per_iter}) * on ({BY}) max by ({BY}) ({iters})"

    return Source(X, _IFB, expr=expr, extra_requires=(_GEN,), estimate=estimate)


_TRITON_TTFT_NOTE = ("Triton core, only with --metrics-config histogram_latencies=true; default buckets "
                     "100/500/2000/5000 ms: quantiles saturate at 5 s")
TRITON_SOURCES = _merge(
    {
        Signal.KV_USAGE: Source(G, _TB, 'kv_cache_block_type="fraction"', note="usedNumBlocks / maxNumBlocks"),
        Signal.RUNNING: Source(G, _TR, 'request_type="scheduled"', agg="sum",
                               note="requests in this iteration's batch"),
        Signal.WAITING: (
            Source(X, _TR, expr=_triton_waiting, extra_requires=("nv_inference_pending_request_count",),
                   note=("active - scheduled (held by the executor, not in this iteration's batch) + the LLM "
                         "model's Triton queue; the executor's own queue is not exported, and the Triton "
                         "queue stays near 0 for decoupled (streaming) models")),
            Source(G, _TR, _WAITING, agg="sum", note="active - scheduled only"),
        ),
        Signal.PREEMPTIONS: Source(
            X, "nv_trt_llm_inflight_batcher_metrics", expr=_triton_preemptions,
            extra_requires=("nv_trt_llm_general_metrics",),
            note="estimate: mean paused requests per iteration x iterations/s (paused_requests is a gauge)",
        ),
        Signal.QUEUE_MEAN: Source(
            X, "nv_inference_queue_duration_us", expr=_triton_queue_mean,
            extra_requires=("nv_inference_request_success",),
            note="Triton scheduler queue of the LLM model only (mean, s)",
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
            Source(C, "nv_inference_request_success", agg="sum", triton_core=True),
            Source(C, "nv_inference_count", agg="sum", triton_core=True,
                   estimate="inferences/s (one per request for LLM models)"),
        ),
        Signal.ABORT_RATE: Source(C, "nv_inference_request_failure", agg="sum", triton_core=True),
        Signal.KV_CAPACITY_TOKENS: Source(
            X, _TB,
            expr=lambda r: (
                f"max by ({BY}) ({r.sel(_TB, _MAXB)}) * on ({BY}) max by ({BY}) ({r.sel(_TB, _TPB)})"
            ),
        ),
        Signal.MAX_RUNNING: Source(G, _TR, 'request_type="max"'),
    },
    _latency("nv_inference_first_response_histogram_ms", scale=0.001, triton_core=True,
             bucket_range=(0.1, 5.0), note=_TRITON_TTFT_NOTE),
)

#: Triton with the Python LLM-API backend: only Triton core metrics, none of the executor's.
TRITON_LLMAPI_SOURCES = _merge(
    {
        Signal.REQUEST_RATE: Source(C, "nv_inference_request_success", agg="sum", triton_core=True),
        Signal.ABORT_RATE: Source(C, "nv_inference_request_failure", agg="sum", triton_core=True),
    },
)
TRITON_LLMAPI_BLIND = (
    "Triton with the TensorRT-LLM LLM-API (Python) backend exports no nv_trt_llm_* metrics: "
    "no KV usage, batch or queue state, only Triton request counters. Serve it with trtllm-serve "
    "(/prometheus/metrics) or the C++ tensorrtllm backend to make it diagnosable"
)


def _trtllm_serve(p: str, m: str) -> dict[Signal, tuple[Source, ...]]:
    anchor = f"{p}time_to_first_token_seconds_count"
    success = f"{p}request_success_total"
    latency = _merge(
        _latency(f"{p}time_to_first_token_seconds", m, bucket_range=(0.001, 2560.0)),
        {
            Signal.QUEUE_P99: Source(HQ, f"{p}request_queue_time_seconds", m, quantile=0.99,
                                     bucket_range=(0.3, 7680.0), note=_Q03),
            Signal.QUEUE_MEAN: Source(HM, f"{p}request_queue_time_seconds", m),
            Signal.TPOT_P99: Source(HQ, f"{p}time_per_output_token_seconds", m, quantile=0.99,
                                    bucket_range=(0.01, 80.0),
                                    note="one average per finished request (TPOT), not per-token ITL"),
            Signal.REQUEST_RATE: Source(C, success, m, agg="sum", lazy_anchor=anchor,
                                        note="created at the first finished request"),
        },
    )
    if not p:  # generation A: only the five latency/request families exist
        return latency

    def aborts(r: Render) -> str:
        cancelled = f"rate({r.sel(success, 'finished_reason=~' + chr(34) + 'cancelled|timeout' + chr(34))}[{r.rw}])"
        errors = f"rate({r.sel(p + 'request_error_total')}[{r.rw}])"
        zero = f"0 * group by ({BY}) ({r.sel(anchor)})"
        # both counters appear at their first event: each absent one reads 0
        return f"(sum by ({BY}) ({cancelled}) or {zero}) + on ({BY}) (sum by ({BY}) ({errors}) or {zero})"

    def preemptions(r: Render) -> str:
        paused = f"sum by ({BY}) (avg_over_time({r.sel(p + 'num_paused_requests')}[{r.rw}]))"
        iter_s = f"max by ({BY}) (avg_over_time({r.sel(p + 'iteration_latency_seconds')}[{r.rw}]) > 0)"
        # a stalled engine runs no iterations (latency 0): no pauses then is 0 events/s, not "no data"
        return f"({paused} / on ({BY}) {iter_s}) or on ({BY}) ({paused} == 0)"

    return _merge(
        latency,
        {
            Signal.KV_USAGE: Source(G, f"{p}kv_cache_utilization", note="usedNumBlocks / maxNumBlocks"),
            Signal.RUNNING: (
                Source(G, f"{p}num_scheduled_requests", agg="sum"),
                Source(G, f"{p}num_requests_running", agg="sum", note="executor active set"),
            ),
            Signal.WAITING: (
                # queued in the executor plus active-but-unscheduled (waiting for KV blocks
                # or a wedged scheduler): the same reading as Triton's request_type="waiting"
                Source(
                    X,
                    f"{p}num_requests_waiting",
                    expr=lambda r: (
                        f"sum by ({BY}) ({r.sel(p + 'num_requests_waiting')}) + on ({BY}) "
                        f"clamp_min(sum by ({BY}) ({r.sel(p + 'num_requests_running')}) - on ({BY}) "
                        f"sum by ({BY}) ({r.sel(p + 'num_scheduled_requests')}), 0)"
                    ),
                    extra_requires=(f"{p}num_requests_running", f"{p}num_scheduled_requests"),
                    note="executor queue + active-but-unscheduled",
                ),
                Source(G, f"{p}num_requests_waiting", agg="sum"),
            ),
            Signal.PREEMPTIONS: Source(
                X, f"{p}num_paused_requests", expr=preemptions,
                extra_requires=(f"{p}iteration_latency_seconds",),
                note="estimate: mean paused requests per iteration / iteration latency",
            ),
            Signal.GEN_TPS: Source(C, f"{p}generation_tokens_total", agg="sum"),
            Signal.PROMPT_TPS: Source(C, f"{p}prompt_tokens_total", agg="sum"),
            Signal.ABORT_RATE: Source(
                X, anchor, expr=aborts,
                note="finished_reason cancelled|timeout (LLM API values: stop, length, timeout, cancelled) + request errors",
            ),
            Signal.KV_CAPACITY_TOKENS: Source(
                X,
                f"{p}kv_cache_max_blocks",
                expr=lambda r: (
                    f"max by ({BY}) ({r.sel(p + 'kv_cache_max_blocks')}) * on ({BY}) "
                    f"max by ({BY}) ({r.sel(p + 'kv_cache_tokens_per_block')})"
                ),
                extra_requires=(f"{p}kv_cache_tokens_per_block",),
            ),
            Signal.MAX_RUNNING: Source(G, f"{p}max_num_active_requests"),
        },
    )


def _lmdeploy(p: str) -> dict[Signal, tuple[Source, ...]]:
    """LMDeploy's PrometheusStatLogger: vLLM-shaped names under ``lmdeploy:``, labels ``model_name``, ``engine`` (dp rank)."""
    failed = 'finished_reason=~"ResponseType.(CANCEL|.*ERROR|OUT_OF_MEMORY|NO_QUEUE|SESSION_.*|HANDLER_NOT_EXIST)"'
    return _merge(
        {
            Signal.KV_USAGE: Source(G, f"{p}gpu_cache_usage_perc", note="fraction of GPU KV blocks in use"),
            Signal.RUNNING: Source(G, f"{p}num_requests_running", agg="sum"),
            Signal.WAITING: Source(G, f"{p}num_requests_waiting", agg="sum",
                                   note="engine queue (requests waiting for a request handle: num_api_requests_waiting)"),
            Signal.QUEUE_P99: Source(HQ, f"{p}request_queue_time_seconds", quantile=0.99,
                                     bucket_range=(0.3, 7680.0), note=_Q03),
            Signal.QUEUE_MEAN: Source(HM, f"{p}request_queue_time_seconds"),
            Signal.ITL_P99: Source(HQ, f"{p}iter_token_latency", quantile=0.99, bucket_range=(0.005, 80.0),
                                   note="inter-token latency (per output step)"),
            Signal.TPOT_P99: Source(HQ, f"{p}time_per_output_token_seconds", quantile=0.99,
                                    bucket_range=(0.005, 80.0), note="per finished request"),
            Signal.GEN_TPS: Source(C, f"{p}generation_tokens_total", agg="sum"),
            Signal.PROMPT_TPS: Source(C, f"{p}prompt_tokens_total", agg="sum"),
            Signal.REQUEST_RATE: Source(C, f"{p}request_success_total", agg="sum",
                                        note="every finished request; finished_reason is str(ResponseType.X)"),
            Signal.ABORT_RATE: Source(C, f"{p}request_success_total", failed, agg="sum",
                                      note="cancelled, errored, out-of-memory or rejected finishes"),
        },
        _latency(f"{p}time_to_first_token_seconds", bucket_range=(0.001, 2560.0)),
    )


_TGI_KV_PROXY = "batch token budget in use (tgi_batch_current_max_tokens / tgi_batch_max_total_tokens), not KV blocks"


def _tgi() -> dict[Signal, tuple[Source, ...]]:
    """Text Generation Inference (Rust ``metrics`` crate; counters scraped with or without ``_total``).

    No KV gauge, no TTFT histogram, no preemption count. KV usage is a proxy: the
    largest token count the running batch may reach over the batch token budget
    (which TGI sizes from free GPU memory at warm-up, i.e. the KV pool).
    """
    return _merge(
        {
            Signal.KV_USAGE: Source(
                X, "tgi_batch_current_max_tokens",
                expr=lambda r: (f"max by ({BY}) ({r.sel('tgi_batch_current_max_tokens')}) / on ({BY}) "
                                f"max by ({BY}) ({r.sel('tgi_batch_max_total_tokens')} > 0)"),
                extra_requires=("tgi_batch_max_total_tokens",), proxy=_TGI_KV_PROXY,
                note="PROXY: " + _TGI_KV_PROXY,
            ),
            Signal.RUNNING: Source(G, "tgi_batch_current_size", agg="sum"),
            Signal.WAITING: Source(G, "tgi_queue_size", agg="sum"),
            Signal.QUEUE_P99: Source(HQ, "tgi_request_queue_duration", quantile=0.99),
            Signal.QUEUE_MEAN: Source(HM, "tgi_request_queue_duration"),
            Signal.TPOT_P99: Source(HQ, "tgi_request_mean_time_per_token_duration", quantile=0.99,
                                    note="mean time per token of each request (TPOT)"),
            Signal.GEN_TPS: Source(C, "tgi_request_generated_tokens_sum", agg="sum",
                                   note="from the per-request histogram: counted at request end"),
            Signal.PROMPT_TPS: Source(C, "tgi_request_input_length_sum", agg="sum"),
            Signal.REQUEST_RATE: tuple(Source(C, f"tgi_request_count{c}", agg="sum", note="requests received")
                                       for c in ("", "_total")),
            # created at the first failure; the request counter's spelling says which name it will have
            Signal.ABORT_RATE: tuple(
                Source(C, f"tgi_request_failure{c}", agg="sum", lazy_anchor=f"tgi_request_count{c}",
                       note="failures by err (validation, overloaded, ...)")
                for c in ("", "_total")
            ),
            Signal.KV_CAPACITY_TOKENS: Source(G, "tgi_batch_max_total_tokens",
                                              note="batch token budget set at warm-up from free memory"),
        },
    )


_DYN_UP = "ai-dynamo/dynamo:lib/runtime/src/metrics/prometheus_names.rs@04070c75"
_DYN_GEN = 'dynamo_endpoint="generate"'
_DYN_KV_PROXY = ("the frontend KV router's predicted active decode blocks of the busiest worker / one worker's "
                 "KV blocks (only with KV routing), not an engine measurement")


def _dynamo_worker() -> dict[Signal, tuple[Source, ...]]:
    """A Dynamo worker's own runtime metrics (``dynamo_component_*``, system port).

    Only when the worker does not also re-export its engine's metrics (then the native
    dialect is used). ``kvstats`` gauges are per ``dp_rank``.
    """
    kv = "dynamo_component_kvstats_gpu_cache_usage_percent"
    return {
        Signal.KV_USAGE: (Source(G, kv, note="0-1 despite the name; max over dp_rank"),),
        Signal.RUNNING: (Source(G, "dynamo_component_inflight_requests", _DYN_GEN, agg="sum",
                                note="in flight at the worker's generate endpoint (running + engine-queued)"),),
        Signal.REQUEST_RATE: (Source(C, "dynamo_component_requests_total", _DYN_GEN, agg="sum"),),
        Signal.ABORT_RATE: (Source(C, "dynamo_component_errors_total", _DYN_GEN, agg="sum", lazy_anchor=kv,
                                   note="work-handler errors by error_type"),),
    }


def _dynamo_frontend() -> dict[Signal, tuple[Source, ...]]:
    """The Dynamo frontend (OpenAI HTTP service, ``dynamo_frontend_*``) in front of all workers of a model."""
    p = "dynamo_frontend_"

    def per_worker_times_workers(r: Render, per_worker: str) -> str:
        n = f"count by ({BY}) ({r.sel(p + 'worker_active_decode_blocks')})"
        return f"max by ({BY}) ({per_worker}) * on ({BY}) ({n})"

    return _merge(
        {
            Signal.KV_USAGE: Source(
                X, f"{p}worker_active_decode_blocks",
                expr=lambda r: (f"max by ({BY}) ({r.sel(p + 'worker_active_decode_blocks')}) / on ({BY}) "
                                f"max by ({BY}) ({r.sel(p + 'model_total_kv_blocks')} > 0)"),
                extra_requires=(f"{p}model_total_kv_blocks",), proxy=_DYN_KV_PROXY, note="PROXY: " + _DYN_KV_PROXY,
            ),
            Signal.RUNNING: Source(
                X, f"{p}inflight_requests",
                expr=lambda r: (f"clamp_min(sum by ({BY}) ({r.sel(p + 'inflight_requests')}) - on ({BY}) "
                                f"sum by ({BY}) ({r.sel(p + 'queued_requests')}), 0)"),
                extra_requires=(f"{p}queued_requests",),
                note="in flight to the engines minus those still waiting for their first token (decoding)",
            ),
            Signal.WAITING: Source(G, f"{p}queued_requests", agg="sum",
                                   note="HTTP requests waiting for their first response"),
            Signal.ITL_P99: Source(HQ, f"{p}inter_token_latency_seconds", quantile=0.99),
            Signal.GEN_TPS: Source(C, f"{p}output_tokens_total", agg="sum"),
            Signal.PROMPT_TPS: Source(C, f"{p}input_sequence_tokens_sum", agg="sum"),
            Signal.REQUEST_RATE: Source(C, f"{p}requests_total", agg="sum"),
            Signal.ABORT_RATE: Source(C, f"{p}requests_total", 'status="error"', agg="sum"),
            Signal.MAX_RUNNING: Source(
                X, f"{p}model_max_num_seqs",
                expr=lambda r: per_worker_times_workers(r, r.sel(p + "model_max_num_seqs")),
                extra_requires=(f"{p}worker_active_decode_blocks",),
                note="max_num_seqs of one worker x workers seen by the router",
            ),
            Signal.KV_CAPACITY_TOKENS: Source(
                X, f"{p}model_total_kv_blocks",
                expr=lambda r: per_worker_times_workers(
                    r, f"{r.sel(p + 'model_total_kv_blocks')} * on ({BY}, model) "
                       f"{r.sel(p + 'model_kv_cache_block_size')}"),
                extra_requires=(f"{p}model_kv_cache_block_size", f"{p}worker_active_decode_blocks"),
                note="one worker's KV blocks x block size x workers",
            ),
        },
        _latency(f"{p}time_to_first_token_seconds"),
    )


_SGL_UP = "sgl-project/sglang:python/sglang/srt/observability/metrics_collector.py@016d8605"
_VLLM_UP = "vllm-project/vllm:vllm/v1/metrics/loggers.py (wheels 0.7.3-0.33.0, shared/engine-metrics.md §1)"
_RAY_UP = "vllm/v1/metrics/ray_wrappers.py, sglang:python/sglang/srt/observability/ray_wrappers.py@18cc7bf2"
_TRITON_UP = ("NVIDIA/TensorRT-LLM:triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/"
              "custom_metrics_reporter.cc@89fd9b74; triton-inference-server/core:src/metric_model_reporter.{h,cc}@73aad7c3")
_SERVE_UP = "NVIDIA/TensorRT-LLM:tensorrt_llm/metrics/collector.py (2026 main)"

#: All dialects, in detection priority order (first match wins for a target).
DIALECTS: tuple[Dialect, ...] = (
    Dialect(
        "vllm-v0",
        "vllm",
        ("vllm:num_requests_swapped", "vllm:cpu_cache_usage_perc", "vllm:avg_generation_throughput_toks_per_s"),
        VLLM_SOURCES,
        versions="V0 <= 0.10.x",
        upstream="vllm-project/vllm:vllm/engine/metrics.py (wheels 0.4.3-0.10.2)",
    ),
    Dialect(
        "vllm-v1",
        "vllm",
        ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        VLLM_SOURCES,
        versions="V1 0.7.3-0.33.0",
        upstream=_VLLM_UP,
    ),
    Dialect(
        "vllm-ray",
        "vllm",
        ("ray_vllm_num_requests_running", "ray_vllm_kv_cache_usage_perc", "ray_vllm_gpu_cache_usage_perc"),
        _vllm("ray_vllm_"),
        versions="vLLM V1 under Ray Serve LLM (RayPrometheusStatLogger), labels + ReplicaId, WorkerId",
        upstream=_RAY_UP,
    ),
    Dialect(
        "vllm-ray-colon",
        "vllm",
        ("ray_vllm:num_requests_running", "ray_vllm:kv_cache_usage_perc", "ray_vllm:gpu_cache_usage_perc"),
        _vllm("ray_vllm:"),
        versions="vLLM under older Ray (the name kept its colon)",
        upstream="ray-project/ray:python/ray/dashboard/modules/metrics/dashboards/serve_llm_dashboard_panels.py",
    ),
    Dialect(
        "sglang",
        "sglang",
        ("sglang:num_running_reqs", "sglang:token_usage"),
        _sglang("sglang:"),
        versions="0.3.6-0.5.23",
        upstream=_SGL_UP,
    ),
    Dialect(
        "sglang-ray",
        "sglang",
        ("ray_sglang_num_running_reqs", "ray_sglang_token_usage"),
        _sglang("ray_sglang_"),
        versions="SGLang under Ray Serve LLM (stat_loggers DI + Ray wrappers), labels + ReplicaId, WorkerId",
        upstream=_RAY_UP,
    ),
    Dialect(
        "lmdeploy",
        "lmdeploy",
        ("lmdeploy:gpu_cache_usage_perc", "lmdeploy:num_requests_running"),
        _lmdeploy("lmdeploy:"),
        versions="PyTorch and TurboMind engines with --enable-metrics",
        upstream="InternLM/lmdeploy:lmdeploy/metrics/loggers.py@1263d5cd",
    ),
    Dialect(
        "tgi",
        "tgi",
        ("tgi_queue_size", "tgi_batch_current_size"),
        _tgi(),
        versions="text-generation-inference router (v2/v3 backends)",
        upstream=("huggingface/text-generation-inference:docs/source/reference/metrics.md@53fdbe61, "
                  "backends/v3/src/lib.rs (tgi_batch_max_total_tokens)"),
    ),
    Dialect(
        "dynamo-frontend",
        "dynamo",
        ("dynamo_frontend_inflight_requests", "dynamo_frontend_queued_requests"),
        _dynamo_frontend(),
        versions="NVIDIA Dynamo frontend (HTTP :8000/metrics)",
        upstream=_DYN_UP,
    ),
    Dialect("trtllm-triton", "trtllm", (_TB, _TR), TRITON_SOURCES, versions="tensorrtllm_backend (C++), Triton >= 23.11",
            upstream=_TRITON_UP),
    Dialect(
        "trtllm-triton-llmapi",
        "trtllm",
        ("nv_inference_request_success",),
        TRITON_LLMAPI_SOURCES,
        model_pattern="tensorrt_llm",
        blind_reason=TRITON_LLMAPI_BLIND,
        versions="Triton + TensorRT-LLM LLM-API (Python) backend",
        upstream="triton-inference-server/core:src/metrics.cc@73aad7c3 (core metrics only)",
    ),
    Dialect(
        "trtllm-serve",
        "trtllm",
        ("trtllm_kv_cache_utilization", "trtllm_num_requests_running", "trtllm_time_to_first_token_seconds_count"),
        _trtllm_serve("trtllm_", ""),
        versions="trtllm-serve /prometheus/metrics, trtllm_ prefix (generation B)",
        upstream=_SERVE_UP,
    ),
    Dialect(
        "trtllm-serve-legacy",
        "trtllm",
        ("time_to_first_token_seconds_count", "request_success_total"),
        _trtllm_serve("", 'engine_type!=""'),
        required_label="engine_type",
        versions="trtllm-serve generation A (no prefix, 5 families)",
        upstream="NVIDIA/TensorRT-LLM:tensorrt_llm/metrics/collector.py@89fd9b74",
    ),
)

DIALECTS = (
    *DIALECTS,
    # last: a worker that also re-exports its engine's metrics is detected as that engine
    Dialect(
        "dynamo-worker",
        "dynamo",
        ("dynamo_component_kvstats_gpu_cache_usage_percent",),
        _dynamo_worker(),
        versions="NVIDIA Dynamo worker runtime metrics (system port, e.g. :8081/metrics)",
        upstream=_DYN_UP,
        defer_to=("vllm", "sglang", "trtllm", "lmdeploy"),
    ),
)

DIALECT_BY_ID: dict[str, Dialect] = {d.id: d for d in DIALECTS}


def all_names() -> list[str]:
    """Every metric name any dialect needs, sorted: the discovery query asks for exactly these."""
    out: set[str] = set()
    for d in DIALECTS:
        out |= d.names()
    return sorted(out)


def kv_proxy(dialect_id: str) -> str:
    """What a dialect's KV usage really measures when it is only a proxy (else ``""``)."""
    d = DIALECT_BY_ID.get(dialect_id)
    srcs = d.sources.get(Signal.KV_USAGE, ()) if d else ()
    return srcs[0].proxy if srcs and all(s.proxy for s in srcs) else ""
