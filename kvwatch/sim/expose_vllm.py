"""vLLM dialects: V1 0.33 / 0.10 / 0.8.2 and V0 0.6 (engine-metrics.md §1)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from kvwatch.sim import buckets as B
from kvwatch.sim.expose import Families, Family, Labels, register
from kvwatch.sim.trace import EngineView
from kvwatch.sim.vocab import Dialect


@dataclass(frozen=True)
class _Variant:
    engine_label: bool
    kv_new: bool  # vllm:kv_cache_usage_perc
    kv_old: bool  # vllm:gpu_cache_usage_perc
    itl: bool  # vllm:inter_token_latency_seconds
    tpot: bool  # vllm:time_per_output_token_seconds
    tpot_req: bool  # vllm:request_time_per_output_token_seconds (>= 0.11.0, one per finished request)
    prefix: bool  # vllm:prefix_cache_*_total (tokens)
    gpu_prefix: str | None  # vllm:gpu_prefix_cache_*_total: "tokens" | "blocks"
    by_reason: bool
    new_buckets: bool  # 0.8.4+
    reasons: tuple[str, ...]
    created: bool
    v0: bool = False


VARIANTS: dict[Dialect, _Variant] = {
    Dialect.VLLM_0_33: _Variant(True, True, False, True, False, True, True, None, True, True,
                                ("stop", "length", "abort", "error", "repetition"), True),
    Dialect.VLLM_0_10: _Variant(True, True, True, True, True, False, True, "tokens", False, True,
                                ("stop", "length", "abort"), True),
    Dialect.VLLM_0_8_2: _Variant(False, False, True, False, True, False, False, "blocks", False, False,
                                 ("stop", "length", "abort"), False),
    Dialect.VLLM_V0_0_6: _Variant(False, False, True, False, True, False, False, None, False, False,
                                  ("stop", "length", "abort"), False, v0=True),
}
_REASON_COUNTER = {"stop": "success_stop", "length": "success_length", "abort": "aborted"}
# V1 drops a request whose client went away (abort in the API server) without finished
# stats, so the simulator's client timeouts never reach finished_reason="abort" there
# (vllm/v1/engine/output_processor.py abort_requests; checked with the real logger in
# conformance/). V0 is left as it was (not checked against its exporter).
_V1_REASON_COUNTER = {"stop": "success_stop", "length": "success_length"}


def _cache_config(d: Dialect, view: EngineView, engine: str | None, engines: int = 1) -> Labels:
    """Labels of vllm:cache_config_info; ``engines``: data-parallel engines behind the
    endpoint (0.33's front end sums num_gpu_blocks over them, kv_cache_size_tokens stays
    per engine: vllm/v1/engine/core_client.py, checked in conformance/)."""
    cfg = view.config
    labels = {"block_size": str(cfg.block_size), "cache_dtype": "auto",
              "gpu_memory_utilization": "0.9", "num_cpu_blocks": "None",
              "num_gpu_blocks": str(cfg.num_blocks)}
    if d is Dialect.VLLM_V0_0_6:  # V0 CacheConfig (vllm PR #3100 era field set)
        labels.update(num_cpu_blocks="2048", sliding_window="None",
                      swap_space_bytes="4294967296", enable_prefix_caching="False")
    else:
        labels.update(enable_prefix_caching="True", prefix_caching_hash_algo="builtin",
                      num_gpu_blocks_override="None", is_attention_free="False",
                      calculate_kv_scales="False", cpu_offload_gb="0", sliding_window="None")
    if d is Dialect.VLLM_0_8_2:  # the num_gpu_blocks="None" bug of V1 0.8.x (vllm #16560)
        labels.update(num_gpu_blocks="None", swap_space_bytes="4294967296")
    if d is Dialect.VLLM_0_33:
        labels["num_gpu_blocks"] = str(cfg.num_blocks * engines)
        tokens = cfg.num_blocks * cfg.block_size
        labels.update(kv_cache_size_tokens=str(tokens),
                      kv_cache_max_concurrency=f"{tokens / cfg.max_model_len:.2f}")
    if engine is not None:
        labels["engine"] = engine
    return tuple(sorted(labels.items()))


def _render(d: Dialect, views: Sequence[EngineView], model_name: str) -> list[Family]:
    v = VARIANTS[d]
    f = Families(created=v.created)
    old = not v.new_buckets
    ttft_b = B.VLLM_TTFT_OLD if old else B.VLLM_TTFT
    itl_b = B.VLLM_ITL_OLD if old else B.VLLM_ITL
    lat_b = B.VLLM_LATENCY_OLD if old else B.VLLM_LATENCY
    for i, view in enumerate(views):
        g, c = view.g, view.c
        engine = str(i) if v.engine_label else None
        lb: Labels = (("engine", engine), ("model_name", model_name)) if engine else (
            ("model_name", model_name),)
        tok_b = B.vllm_token_buckets(view.config.max_model_len)
        # read after the step's finished requests left (V1 update_from_output, V0 likewise)
        f.gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                lb, g["running_shown"])
        f.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                lb, g["waiting"])
        if v.v0:
            f.gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", lb, 0.0)
        if v.by_reason:
            help_ = ("Number of waiting requests by reason. Reason labels: 'capacity' = waiting"
                     " for scheduling capacity; 'deferred' = deferred by transient constraints"
                     " (LoRA budget, KV transfer, blocked status). Sum of all reasons equals"
                     " vllm:num_requests_waiting.")
            f.gauge("vllm:num_requests_waiting_by_reason", help_, (*lb, ("reason", "capacity")),
                    g["waiting"])
            f.gauge("vllm:num_requests_waiting_by_reason", help_, (*lb, ("reason", "deferred")),
                    0.0)
        if v.kv_old:
            f.gauge("vllm:gpu_cache_usage_perc",
                    "GPU KV-cache usage. 1 means 100 percent usage." + (
                        " DEPRECATED: Use vllm:kv_cache_usage_perc instead." if v.kv_new else ""),
                    lb, g["usage"])
        if v.v0:
            f.gauge("vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.",
                    lb, 0.0)
            q, h = c["prefix_queries"], c["prefix_hits"]
            f.gauge("vllm:gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate.", lb,
                    np.divide(h, q, out=np.zeros_like(np.asarray(q, float)), where=q > 0))
            f.gauge("vllm:avg_prompt_throughput_toks_per_s",
                    "Average prefill throughput in tokens/s.", lb, g["prompt_tps"])
            f.gauge("vllm:avg_generation_throughput_toks_per_s",
                    "Average generation throughput in tokens/s.", lb, g["gen_tps"])
        if v.kv_new:
            f.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                    lb, g["usage"])
        f.gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                _cache_config(d, view, engine, len(views)), 1.0)
        f.counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
                  lb, c["preemptions"])
        if v.prefix:
            f.counter("vllm:prefix_cache_queries_total",
                      "Prefix cache queries, in terms of number of queried tokens.", lb,
                      c["prefix_queries"])
            f.counter("vllm:prefix_cache_hits_total",
                      "Prefix cache hits, in terms of number of cached tokens.", lb,
                      c["prefix_hits"])
        if v.gpu_prefix == "tokens":
            f.counter("vllm:gpu_prefix_cache_queries_total",
                      "GPU prefix cache queries, in terms of number of queried tokens. "
                      "DEPRECATED: Use vllm:prefix_cache_queries instead.", lb,
                      c["prefix_queries"])
            f.counter("vllm:gpu_prefix_cache_hits_total",
                      "GPU prefix cache hits, in terms of number of cached tokens. "
                      "DEPRECATED: Use vllm:prefix_cache_hits instead.", lb, c["prefix_hits"])
        elif v.gpu_prefix == "blocks":
            bs = view.config.block_size
            f.counter("vllm:gpu_prefix_cache_queries_total",
                      "GPU prefix cache queries, in terms of number of queried blocks.", lb,
                      np.floor(np.asarray(c["prefix_queries"]) / bs))
            f.counter("vllm:gpu_prefix_cache_hits_total",
                      "GPU prefix cache hits, in terms of number of cached blocks.", lb,
                      np.floor(np.asarray(c["prefix_hits"]) / bs))
        f.counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", lb,
                  c["prompt_tokens"])
        f.counter("vllm:generation_tokens_total", "Number of generation tokens processed.", lb,
                  c["generation_tokens"])
        reason_counter = _REASON_COUNTER if v.v0 else _V1_REASON_COUNTER
        for reason in v.reasons:
            f.counter("vllm:request_success_total", "Count of successfully processed requests.",
                      (*lb, ("finished_reason", reason)),
                      c[reason_counter[reason]] if reason in reason_counter else 0.0)
        f.histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", lb, view,
                    "prompt_tokens", tok_b)
        f.histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", lb,
                    view, "gen_tokens", tok_b)
        f.histogram("vllm:time_to_first_token_seconds",
                    "Histogram of time to first token in seconds.", lb, view, "ttft", ttft_b)
        if v.itl:
            f.histogram("vllm:inter_token_latency_seconds",
                        "Histogram of inter-token latency in seconds.", lb, view, "itl", itl_b)
        if v.tpot:
            f.histogram("vllm:time_per_output_token_seconds",
                        "Histogram of time per output token in seconds.", lb, view, "itl", itl_b)
        if v.tpot_req:  # (e2e - TTFT) / (output tokens - 1) of each finished request
            f.histogram("vllm:request_time_per_output_token_seconds",
                        "Histogram of time_per_output_token_seconds per request.", lb, view, "tpot_req", itl_b)
        f.histogram("vllm:e2e_request_latency_seconds",
                    "Histogram of e2e request latency in seconds.", lb, view, "e2e", lat_b)
        f.histogram("vllm:request_queue_time_seconds",
                    "Histogram of time spent in WAITING phase for request.", lb, view, "queue",
                    lat_b)
    return f.done()


for _dialect in VARIANTS:
    register(_dialect)(partial(_render, _dialect))


def render_0_33(views: Sequence[EngineView], model_name: str) -> list[Family]:
    """The native V1 0.33 families (the Ray wrapper re-exports these)."""
    return _render(Dialect.VLLM_0_33, views, model_name)
