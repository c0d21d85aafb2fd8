"""vLLM sources (native ``vllm:``, and re-exported by Ray Serve LLM)."""

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
from kvwatch.core.dialects.model import Source, SourceKind
from kvwatch.core.signals import Signal

# vLLM: `model_name!=""` keeps the production-stack router's look-alike series
# (label `server`, no `model_name`) out; cache_config_info carries no model_name.
_VM = 'model_name!=""'


def vllm_sources(p: str, total: str = "_total") -> dict[Signal, tuple[Source, ...]]:
    """vLLM V1/V0 names with prefix ``p`` (``vllm:`` natively, ``ray_vllm_`` through Ray).

    ``total`` is the suffix of counters as scraped (prometheus_client always adds
    ``_total``; Ray's exporter too, older Ray versions did not).
    """
    return merge_sources(
        {
            Signal.KV_USAGE: (
                Source(G, f"{p}kv_cache_usage_perc", _VM,
                       note="blocks held by running requests / pool; evictable prefix-cache blocks count as free"),
                Source(G, f"{p}gpu_cache_usage_perc", _VM,
                       note="old name (<= 0.10.x; 0.11.x only with --show-hidden-metrics-for-version=0.10)"),
            ),
            Signal.RUNNING: Source(G, f"{p}num_requests_running", _VM, agg="sum", after_finishes=True),
            Signal.WAITING: (
                Source(G, f"{p}num_requests_waiting", _VM, agg="sum", note=">= 0.20.2: capacity-waiting + deferred"),
                queue_occupancy(f"{p}request_queue_time_seconds", _VM),
            ),
            Signal.WAITING_CAPACITY: Source(
                G, f"{p}num_requests_waiting_by_reason", f'{_VM}, reason="capacity"', agg="sum"
            ),
            Signal.PREEMPTIONS: Source(C, f"{p}num_preemptions{total}", _VM, agg="sum"),
            Signal.QUEUE_P99: Source(HQ, f"{p}request_queue_time_seconds", _VM, quantile=0.99,
                                     bucket_range=(0.3, 7680.0), note=QUEUE_BUCKET_NOTE + "; observed at request finish"),
            Signal.QUEUE_MEAN: Source(HM, f"{p}request_queue_time_seconds", _VM),
            Signal.ITL_P99: (
                Source(HQ, f"{p}inter_token_latency_seconds", _VM, quantile=0.99, bucket_range=(0.01, 80.0),
                       note="one observation per output step (>= 0.10.2)"),
                Source(HQ, f"{p}time_per_output_token_seconds", _VM, quantile=0.99, bucket_range=(0.01, 80.0),
                       note="old name of the same per-step observations (<= 0.11.x, hidden 0.12-0.14)"),
            ),
            Signal.ITL_MEAN: (
                Source(HM, f"{p}inter_token_latency_seconds", _VM, note="mean of the per-step observations (>= 0.10.2)"),
                Source(HM, f"{p}time_per_output_token_seconds", _VM, note="old name (<= 0.11.x, hidden 0.12-0.14)"),
            ),
            Signal.TPOT_P99: Source(HQ, f"{p}request_time_per_output_token_seconds", _VM, quantile=0.99,
                                    bucket_range=(0.01, 80.0), note="per finished request (>= 0.11.0)"),
            Signal.GEN_TPS: (
                Source(C, f"{p}generation_tokens{total}", _VM, agg="sum"),
                Source(C, f"{p}request_generation_tokens_sum", _VM, agg="sum", counted_at_finish=True,
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
            Signal.REQUEST_TIME_PER_TOKEN: (
                request_time_per_token(f"{p}e2e_request_latency_seconds", f"{p}generation_tokens{total}", _VM),
                request_time_per_token(f"{p}e2e_request_latency_seconds", f"{p}request_generation_tokens_sum", _VM),
            ),
            Signal.ABORT_RATE: Source(
                C, f"{p}request_success{total}", f'{_VM}, finished_reason=~"abort|error"', agg="sum"
            ),
            Signal.KV_CAPACITY_TOKENS: Source(
                SourceKind.VLLM_CACHE_INFO, f"{p}cache_config_info",
                note="kv_cache_size_tokens (>= 0.24) else num_gpu_blocks x block_size, per engine, summed",
            ),
        },
        ttft_sources(f"{p}time_to_first_token_seconds", _VM, bucket_range=(0.001, 2560.0)),
    )


VLLM_SOURCES = vllm_sources("vllm:")
