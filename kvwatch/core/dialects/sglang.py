"""SGLang sources (native ``sglang:``, and re-exported by Ray Serve LLM)."""

from __future__ import annotations

from kvwatch.core.dialects.compose import (
    HM,
    HQ,
    C,
    G,
    X,
    merge_sources,
    queue_occupancy,
    request_time_per_token,
    ttft_sources,
)
from kvwatch.core.dialects.model import BY, Render, Source
from kvwatch.core.signals import Signal


#: labels that tell apart the scheduler ranks of ONE SGLang replica: with
#: enable_metrics_for_all_schedulers every TP/PP/EP rank exports the same batch (the
#: real exporter, tests/fixtures/conformance), so counts are taken once per replica
#: (max over its ranks) and only then summed over replicas (dp_rank) and models.
def sglang_sources(p: str) -> dict[Signal, tuple[Source, ...]]:
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
        return f"max by ({BY}) ({r.gauge(p + 'num_used_tokens', pr)} / ({r.gauge(p + 'token_usage', pr)} > 0.05))"

    return merge_sources(
        {
            Signal.KV_USAGE: Source(G, f"{p}token_usage", pr,
                                    note="max over full/SWA/Mamba pools, rounded to 0.01; radix-cached tokens count as free"),
            # logged after finishes: log_decode_stats counts the decode batch that ran (filtered of
            # the previous step's finished requests), log_prefill_stats the running batch before
            # the prefill that refills it
            Signal.RUNNING: Source(G, f"{p}num_running_reqs", pr, agg="sum", dedup_by=dp, after_finishes=True),
            Signal.WAITING: (
                Source(G, f"{p}num_queue_reqs", pr, agg="sum", dedup_by=dp),
                # scheduler ranks of one replica observe the same requests: once per dp_rank
                queue_occupancy(f"{p}queue_time_seconds", dedup_by=dp),
            ),
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
            Signal.ITL_MEAN: (
                Source(HM, f"{p}inter_token_latency_seconds", note="mean of the per-token observations"),
                Source(HM, f"{p}time_per_output_token_seconds", note="mean of the per-token observations (0.4.x)"),
                Source(HM, f"{p}request_time_per_output_token_seconds", note="mean of the requests' own means (0.5.23)"),
            ),
            Signal.TPOT_P99: Source(HQ, f"{p}request_time_per_output_token_seconds", quantile=0.99,
                                    note="per finished request (0.5.23)"),
            Signal.GEN_TPS: (
                # counted at every decode iteration by the scheduler (MetricsReporter.
                # report_decode_stats → increment_realtime_tokens); created at the first decode
                Source(C, f"{p}realtime_tokens_total", 'mode="decode"', agg="sum", dedup_by=dp,
                       note="decoded tokens, counted every scheduler iteration (>= 0.5.10)"),
                Source(C, f"{p}generation_tokens_total", agg="sum", counted_at_finish=True,
                       note="added when a request finishes (TokenizerMetricsCollector.observe_one_finished_request)"),
                Source(G, f"{p}gen_throughput", pr, agg="sum", dedup_by=dp,
                       estimate="the scheduler's decode throughput gauge, tokens/s"),
            ),
            Signal.PROMPT_TPS: Source(C, f"{p}prompt_tokens_total", agg="sum"),
            Signal.REQUEST_RATE: (
                Source(C, f"{p}num_requests_total", agg="sum"),
                Source(C, f"{p}e2e_request_latency_seconds_count", agg="sum",
                       estimate="finished requests/s from the end-to-end latency histogram count"),
            ),
            Signal.REQUEST_TIME_PER_TOKEN: request_time_per_token(f"{p}e2e_request_latency_seconds",
                                                                 f"{p}generation_tokens_total"),
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
        ttft_sources(f"{p}time_to_first_token_seconds", bucket_range=(0.1, 400.0)),
    )
