"""NVIDIA Dynamo sources: the frontend and the worker runtime."""

from __future__ import annotations

from kvwatch.core.dialects.compose import (
    HM,
    HQ,
    C,
    G,
    X,
    merge_sources,
    request_time_per_token,
    ttft_sources,
)
from kvwatch.core.dialects.model import BY, Render, Source
from kvwatch.core.signals import Signal

_DYN_GEN = 'dynamo_endpoint="generate"'
_DYN_KV_PROXY = ("the frontend KV router's predicted active decode blocks of the busiest worker / one worker's "
                 "KV blocks (only with KV routing), not an engine measurement")


def dynamo_worker_sources() -> dict[Signal, tuple[Source, ...]]:
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


def dynamo_frontend_sources() -> dict[Signal, tuple[Source, ...]]:
    """The Dynamo frontend (OpenAI HTTP service, ``dynamo_frontend_*``) in front of all workers of a model."""
    p = "dynamo_frontend_"

    def per_worker_times_workers(r: Render, per_worker: str) -> str:
        n = f"count by ({BY}) ({r.gauge(p + 'worker_active_decode_blocks')})"
        return f"max by ({BY}) ({per_worker}) * on ({BY}) ({n})"

    return merge_sources(
        {
            Signal.KV_USAGE: Source(
                X, f"{p}worker_active_decode_blocks",
                expr=lambda r: (f"max by ({BY}) ({r.gauge(p + 'worker_active_decode_blocks')}) / on ({BY}) "
                                f"max by ({BY}) ({r.gauge(p + 'model_total_kv_blocks')} > 0)"),
                extra_requires=(f"{p}model_total_kv_blocks",), proxy=_DYN_KV_PROXY, note="PROXY: " + _DYN_KV_PROXY,
            ),
            Signal.RUNNING: Source(
                X, f"{p}inflight_requests",
                expr=lambda r: (f"clamp_min(sum by ({BY}) ({r.gauge(p + 'inflight_requests')}) - on ({BY}) "
                                f"sum by ({BY}) ({r.gauge(p + 'queued_requests')}), 0)"),
                extra_requires=(f"{p}queued_requests",),
                note="in flight to the engines minus those still waiting for their first token (decoding)",
            ),
            Signal.WAITING: Source(G, f"{p}queued_requests", agg="sum", counts_prefill=True,
                                   note="HTTP requests waiting for their first response, prefill included "
                                        "(kvwatch reads the part beyond what a within-SLO prefill holds)"),
            Signal.ITL_P99: Source(HQ, f"{p}inter_token_latency_seconds", quantile=0.99),
            Signal.ITL_MEAN: Source(HM, f"{p}inter_token_latency_seconds", note="mean of the streamed tokens' gaps"),
            Signal.GEN_TPS: Source(C, f"{p}output_tokens_total", agg="sum"),
            Signal.REQUEST_TIME_PER_TOKEN: request_time_per_token(f"{p}request_duration_seconds",
                                                                 f"{p}output_tokens_total"),
            Signal.PROMPT_TPS: Source(C, f"{p}input_sequence_tokens_sum", agg="sum"),
            Signal.REQUEST_RATE: (
                Source(C, f"{p}requests_total", agg="sum"),
                Source(C, f"{p}request_duration_seconds_count", agg="sum",
                       estimate="finished requests/s from the request-duration histogram count"),
            ),
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
        ttft_sources(f"{p}time_to_first_token_seconds"),
    )
