"""LMDeploy sources."""

from __future__ import annotations

from kvwatch.core.dialects.compose import (
    HM,
    HQ,
    QUEUE_BUCKET_NOTE,
    C,
    G,
    merge_sources,
    queue_occupancy,
    request_time_per_token,
    ttft_sources,
)
from kvwatch.core.dialects.model import Source
from kvwatch.core.signals import Signal


def lmdeploy_sources(p: str) -> dict[Signal, tuple[Source, ...]]:
    """LMDeploy's PrometheusStatLogger: vLLM-shaped names under ``lmdeploy:``, labels ``model_name``, ``engine`` (dp rank)."""
    failed = 'finished_reason=~"ResponseType.(CANCEL|.*ERROR|OUT_OF_MEMORY|NO_QUEUE|SESSION_.*|HANDLER_NOT_EXIST)"'
    return merge_sources(
        {
            Signal.KV_USAGE: Source(G, f"{p}gpu_cache_usage_perc", note="fraction of GPU KV blocks in use"),
            Signal.RUNNING: Source(G, f"{p}num_requests_running", agg="sum"),
            Signal.WAITING: (
                Source(G, f"{p}num_requests_waiting", agg="sum",
                       note="engine queue (requests waiting for a request handle: num_api_requests_waiting)"),
                queue_occupancy(f"{p}request_queue_time_seconds"),
            ),
            Signal.QUEUE_P99: Source(HQ, f"{p}request_queue_time_seconds", quantile=0.99,
                                     bucket_range=(0.3, 7680.0), note=QUEUE_BUCKET_NOTE),
            Signal.QUEUE_MEAN: Source(HM, f"{p}request_queue_time_seconds"),
            Signal.ITL_P99: Source(HQ, f"{p}iter_token_latency", quantile=0.99, bucket_range=(0.005, 80.0),
                                   note="inter-token latency (per output step)"),
            Signal.ITL_MEAN: (
                Source(HM, f"{p}iter_token_latency", note="mean of the per-step observations"),
                Source(HM, f"{p}time_per_output_token_seconds", note="mean of the requests' own means"),
            ),
            Signal.TPOT_P99: Source(HQ, f"{p}time_per_output_token_seconds", quantile=0.99,
                                    bucket_range=(0.005, 80.0), note="per finished request"),
            Signal.GEN_TPS: Source(C, f"{p}generation_tokens_total", agg="sum"),
            Signal.REQUEST_TIME_PER_TOKEN: request_time_per_token(f"{p}e2e_request_latency_seconds",
                                                                 f"{p}generation_tokens_total"),
            Signal.PROMPT_TPS: Source(C, f"{p}prompt_tokens_total", agg="sum"),
            Signal.REQUEST_RATE: Source(C, f"{p}request_success_total", agg="sum",
                                        note="every finished request; finished_reason is str(ResponseType.X)"),
            Signal.ABORT_RATE: Source(C, f"{p}request_success_total", failed, agg="sum",
                                      note="cancelled, errored, out-of-memory or rejected finishes"),
        },
        ttft_sources(f"{p}time_to_first_token_seconds", bucket_range=(0.001, 2560.0)),
    )
