"""TensorRT-LLM sources: the C++ backend and the LLM-API backend under Triton, and trtllm-serve."""

from __future__ import annotations

from kvwatch.core.dialects.compose import (
    HM,
    HQ,
    QUEUE_BUCKET_NOTE,
    C,
    G,
    X,
    merge_sources,
    queue_occupancy,
    request_time_per_token,
    ttft_sources,
)
from kvwatch.core.dialects.model import BY, TRITON_LLM_MARKER, Render, Source, per_target_ratio
from kvwatch.core.signals import Signal

_TB = "nv_trt_llm_kv_cache_block_metrics"
_TR = TRITON_LLM_MARKER
_WAITING = 'request_type="waiting"'
_MAXB = 'kv_cache_block_type="max"'
_TPB = 'kv_cache_block_type="tokens_per"'
_PAUSED = 'inflight_batcher_specific_metric="paused_requests"'
_ITER = 'general_type="iteration_counter"'
_IFB = "nv_trt_llm_inflight_batcher_metrics"
_GEN = "nv_trt_llm_general_metrics"
_IGNORE = "inflight_batcher_specific_metric, general_type"


def _triton_waiting(r: Render) -> str:
    pending = r.llm(r.gauge("nv_inference_pending_request_count",
                          f'model=~"{r.triton_model}"' if r.triton_model else ""))
    return f"sum by ({BY}) ({r.gauge(_TR, _WAITING)}) + on ({BY}) sum by ({BY}) ({pending})"


def _iterations_per_s(r: Render) -> str:
    """The executor's iterations per second (its iteration counter is a gauge that only grows,
    so ``rate`` reads it; a restart is a counter reset)."""
    return f"rate({r.sel(_GEN, _ITER)}[{r.rw}])"


def _triton_preemptions(r: Render) -> str:
    # paused requests per iteration (mean over the window) x iterations per second
    return (f"sum by ({BY}) (avg_over_time({r.sel(_IFB, _PAUSED)}[{r.rw}]) "
            f"* ignoring ({_IGNORE}) {_iterations_per_s(r)})")


def _llm_core_rate(r: Render, metric: str) -> str:
    """The per-second rate of a Triton core counter (one series per model) of the LLM model only."""
    m = f'model=~"{r.triton_model}"' if r.triton_model else ""
    return r.llm(f"rate({r.sel(metric, m)}[{r.rw}])")


def _triton_queue_mean(r: Render) -> str:
    num, den = (_llm_core_rate(r, n) for n in ("nv_inference_queue_duration_us", "nv_inference_request_success"))
    return f"{per_target_ratio(num, den)} / 1e6"


def _triton_request_time_per_token(r: Render) -> str:
    """Seconds of the LLM model's requests (Triton core, queue included) per output token it
    generated (the backend's per-request histogram, counted at finish)."""
    num = _llm_core_rate(r, "nv_inference_request_duration_us")
    den = f"rate({r.sel('nv_llm_output_token_len_sum')}[{r.rw}])"
    return f"{per_target_ratio(num, den)} / 1e6"


def _per_iteration_rate(r: Render, kind: str) -> str:
    """A per-iteration gauge of the in-flight batcher (its mean over the window) times
    iterations per second: per second what it counts per iteration."""
    which = f'inflight_batcher_specific_metric="{kind}"'
    per_iter = f"avg_over_time({r.sel(_IFB, which)}[{r.rw}])"
    return f"sum by ({BY}) ({per_iter}) * on ({BY}) max by ({BY}) ({_iterations_per_s(r)})"


def _per_iteration(kind: str, estimate: str) -> Source:
    """Triton without the ``nv_llm_*`` token histograms: a per-iteration gauge of the in-flight
    batcher times iterations per second."""
    return Source(X, _IFB, expr=lambda r: _per_iteration_rate(r, kind), extra_requires=(_GEN,), estimate=estimate)


def _triton_request_time_per_token_by_iterations(r: Render) -> str:
    """As :func:`_triton_request_time_per_token` where the token histograms are missing: the
    output tokens are the decode requests of each iteration (one token each) per second.

    The gauge's mean over the window counts the scrapes of an idle executor too, so a sparse
    pool's tokens are under-counted and its time per token over-stated: against the exact value
    on the base variant of 54 corpora, low-demand pools read 0.88-8.7x (median 1.29x), the rest
    0.4-1.1x; 4 of 91 low-demand pools over the compute-bound rule's 0.25 s where the exact value
    puts 2, 23 of 24 compute-bound ones as with the exact. A window maximum instead errs the
    other way and found 16 of the 24."""
    num = f"sum by ({BY}) ({_llm_core_rate(r, 'nv_inference_request_duration_us')})"
    return f"{num} / on ({BY}) ({_per_iteration_rate(r, 'generation_requests')}) / 1e6"


_TRITON_TTFT_NOTE = ("Triton core, only with --metrics-config histogram_latencies=true; default buckets "
                     "100/500/2000/5000 ms: quantiles saturate at 5 s")
TRITON_SOURCES = merge_sources(
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
            X, _IFB, expr=_triton_preemptions,
            extra_requires=(_GEN,),
            note="estimate: mean paused requests per iteration x iterations/s (paused_requests is a gauge)",
        ),
        Signal.QUEUE_MEAN: Source(
            X, "nv_inference_queue_duration_us", expr=_triton_queue_mean,
            extra_requires=("nv_inference_request_success",),
            note="Triton scheduler queue of the LLM model only (mean, s)",
        ),
        Signal.GEN_TPS: (
            Source(C, "nv_llm_output_token_len_sum", agg="sum", counted_at_finish=True,
                   note="per-request histogram: counted when the request finishes"),
            _per_iteration("generation_requests", "decode requests per iteration x iterations/s = tokens/s"),
        ),
        Signal.PROMPT_TPS: (
            Source(C, "nv_llm_input_token_len_sum", agg="sum"),
            _per_iteration("total_context_tokens", "context tokens per iteration x iterations/s = tokens/s"),
        ),
        Signal.REQUEST_RATE: (
            Source(C, "nv_inference_request_success", agg="sum", triton_core=True, counts_aborted=False),
            Source(C, "nv_inference_count", agg="sum", triton_core=True, counts_aborted=False,
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
        # the executor's iteration counter (rate as in _iterations_per_s); it stands still
        # while the executor runs no iteration
        Signal.STEP_RATE: Source(C, _GEN, _ITER, agg="sum", note="executor iterations per second"),
        Signal.REQUEST_TIME_PER_TOKEN: (
            Source(
                X, "nv_inference_request_duration_us", expr=_triton_request_time_per_token,
                extra_requires=("nv_llm_output_token_len_sum",),
                note="Triton core request time of the LLM model / its output tokens (s per token, queue included)",
            ),
            Source(
                X, "nv_inference_request_duration_us", expr=_triton_request_time_per_token_by_iterations,
                extra_requires=(_IFB, _GEN),
                estimate="request time / (decode requests per iteration x iterations/s): tokens counted per iteration",
            ),
        ),
    },
    ttft_sources("nv_inference_first_response_histogram_ms", scale=0.001, triton_core=True,
             bucket_range=(0.1, 5.0), note=_TRITON_TTFT_NOTE),
)

#: Triton with the Python LLM-API backend: only Triton core metrics, none of the executor's.
TRITON_LLMAPI_SOURCES = merge_sources(
    {
        Signal.REQUEST_RATE: Source(C, "nv_inference_request_success", agg="sum", triton_core=True,
                                    counts_aborted=False),
        Signal.ABORT_RATE: Source(C, "nv_inference_request_failure", agg="sum", triton_core=True),
    },
)
TRITON_LLMAPI_BLIND = (
    "Triton with the TensorRT-LLM LLM-API (Python) backend exports no nv_trt_llm_* metrics: "
    "no KV usage, batch or queue state, only Triton request counters. Serve it with trtllm-serve "
    "(/prometheus/metrics) or the C++ tensorrtllm backend to make it diagnosable"
)


def trtllm_serve_sources(p: str, m: str) -> dict[Signal, tuple[Source, ...]]:
    anchor = f"{p}time_to_first_token_seconds_count"
    success = f"{p}request_success_total"
    latency = merge_sources(
        ttft_sources(f"{p}time_to_first_token_seconds", m, bucket_range=(0.001, 2560.0)),
        {
            Signal.QUEUE_P99: Source(HQ, f"{p}request_queue_time_seconds", m, quantile=0.99,
                                     bucket_range=(0.3, 7680.0), note=QUEUE_BUCKET_NOTE),
            Signal.QUEUE_MEAN: Source(HM, f"{p}request_queue_time_seconds", m),
            Signal.ITL_MEAN: Source(HM, f"{p}time_per_output_token_seconds", m,
                                    note="mean of the requests' own means"),
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

    return merge_sources(
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
                        f"sum by ({BY}) ({r.gauge(p + 'num_requests_waiting')}) + on ({BY}) "
                        f"clamp_min(sum by ({BY}) ({r.gauge(p + 'num_requests_running')}) - on ({BY}) "
                        f"sum by ({BY}) ({r.gauge(p + 'num_scheduled_requests')}), 0)"
                    ),
                    extra_requires=(f"{p}num_requests_running", f"{p}num_scheduled_requests"),
                    note="executor queue + active-but-unscheduled",
                ),
                Source(G, f"{p}num_requests_waiting", agg="sum", misses_admitted=True,
                       note="executor queue only: requests admitted but not scheduled are not counted"),
                queue_occupancy(f"{p}request_queue_time_seconds", m),
            ),
            Signal.PREEMPTIONS: Source(
                X, f"{p}num_paused_requests", expr=preemptions,
                extra_requires=(f"{p}iteration_latency_seconds",),
                note="estimate: mean paused requests per iteration / iteration latency",
            ),
            Signal.GEN_TPS: Source(C, f"{p}generation_tokens_total", agg="sum"),
            Signal.REQUEST_TIME_PER_TOKEN: request_time_per_token(f"{p}e2e_request_latency_seconds",
                                                                 f"{p}generation_tokens_total", m),
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


#: What marks a Triton server running the C++ TensorRT-LLM backend.
TRITON_MARKERS: tuple[str, ...] = (_TB, _TR)
