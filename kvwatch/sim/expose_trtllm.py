"""TensorRT-LLM dialects: Triton backend ``nv_trt_llm_*`` and trtllm-serve gen A/B (§2)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvwatch.sim import buckets as B
from kvwatch.sim.expose import Families, Family, Labels, register
from kvwatch.sim.trace import EngineView
from kvwatch.sim.vocab import Dialect


def _active_queued(view: EngineView) -> tuple[np.ndarray, np.ndarray]:
    """Executor active set (scheduled + waiting for resources, capped at max) and queue."""
    running, waiting = np.asarray(view.g["running"]), np.asarray(view.g["waiting"])
    cap = np.asarray(view.g["max_num_seqs"])
    active = np.minimum(running + waiting, np.maximum(cap, running))
    return active, running + waiting - active


def _per_iteration(total: object, iterations: object) -> np.ndarray:
    """Tokens per engine iteration between scrapes (``numCtxTokens`` is the context tokens
    scheduled in one iteration, not the prefill backlog); the first scrape averages since start."""
    tot, its = np.asarray(total, dtype=float), np.asarray(iterations, dtype=float)
    if tot.ndim == 0:
        return np.asarray(tot / its if its > 0 else 0.0)
    d_tot, d_its = np.diff(tot, prepend=0.0), np.diff(its, prepend=0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(d_its > 0, d_tot / np.where(d_its > 0, d_its, 1.0), 0.0)


@register(Dialect.TRTLLM_TRITON)
def triton(views: Sequence[EngineView], model_name: str) -> list[Family]:
    """Triton backend: ``model``/``version`` labels, category label per series; no TTFT."""
    view = views[0]
    g, c, cfg = view.g, view.c, view.config
    f = Families()
    base: Labels = (("model", "tensorrt_llm"), ("version", "1"))
    active, queued = _active_queued(view)
    running = np.asarray(g["running"])
    for kind, value in (("waiting", active - running), ("context", g["prefilling"]),
                        ("scheduled", running), ("max", g["max_num_seqs"]), ("active", active)):
        f.gauge("nv_trt_llm_request_metrics", "TRT LLM request metrics",
                (*base, ("request_type", kind)), value)
    for kind, value in (("pinned", 0.0), ("gpu", 1610236.0), ("cpu", 0.0)):
        f.gauge("nv_trt_llm_runtime_memory_metrics", "TRT LLM runtime memory metrics",
                (("memory_type", kind), *base), value)
    used = np.asarray(g["used_blocks"])
    blocks = (("fraction", used / cfg.num_blocks), ("tokens_per", float(cfg.block_size)),
              ("used", used), ("free", cfg.num_blocks - used), ("max", float(cfg.num_blocks)),
              ("reused", np.floor(np.asarray(c["prefix_hits"]) / cfg.block_size)))
    for kind, value in blocks:
        f.gauge("nv_trt_llm_kv_cache_block_metrics", "TRT LLM KV cache block metrics",
                (("kv_cache_block_type", kind), *base), value)
    ifb = (("micro_batch_id", 0.0), ("generation_requests", g["decoding"]),
           ("total_context_tokens", _per_iteration(c["prompt_tokens"], c["iterations"])),
           ("paused_requests", g["paused"]))
    for kind, value in ifb:
        f.gauge("nv_trt_llm_inflight_batcher_metrics",
                "TRT LLM inflight_batcher-specific metrics",
                (("inflight_batcher_specific_metric", kind), *base), value)
    for kind, value in (("iteration_counter", np.floor(np.asarray(c["iterations"]))),
                        ("timestamp", np.floor(np.asarray(view.wall_time) * 1e6))):
        f.gauge("nv_trt_llm_general_metrics", "General TRT LLM metrics",
                (("general_type", kind), *base), value)
    ok = np.asarray(c["success_stop"]) + np.asarray(c["success_length"])
    core = (
        ("nv_inference_request_success",
         "Number of successful inference requests, all batch sizes", ok),
        ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
         c["aborted"]),
        ("nv_inference_count",
         "Number of inferences performed (does not include cached requests)", ok),
        ("nv_inference_request_duration_us",
         "Cumulative inference request duration in microseconds (includes cached requests)",
         np.floor(np.asarray(c["request_us"]))),
        ("nv_inference_queue_duration_us",
         "Cumulative inference queuing duration in microseconds (includes cached requests)",
         np.floor(np.asarray(c["queue_us"]))),
    )
    for name, help_, value in core:
        f.counter(name, help_, base, value)
    # the ensemble around the LLM: every request also passes pre/post-processing (twice as
    # many successes on the BLS-style preprocessing), none of them queue at the executor
    for model, calls in (("ensemble", 1.0), ("preprocessing", 2.0), ("postprocessing", 1.0)):
        other: Labels = (("model", model), ("version", "1"))
        for name, help_, value in core:
            scale = 0.0 if name == "nv_inference_queue_duration_us" else calls
            f.counter(name, help_, other, np.floor(np.asarray(value) * scale))
    f.gauge("nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model.", base, queued)
    for model in ("ensemble", "preprocessing", "postprocessing"):
        f.gauge("nv_inference_pending_request_count",
                "Instantaneous number of pending requests awaiting execution per-model.",
                (("model", model), ("version", "1")), 0.0)
    f.histogram("nv_llm_input_token_len", "TRT LLM response metrics",
                (*base, ("response_metric_type", "total_input_tokens")), view, "prompt_tokens",
                B.TRITON_TOKENS)
    f.histogram("nv_llm_output_token_len", "TRT LLM response metrics",
                (*base, ("response_metric_type", "total_output_tokens")), view, "gen_tokens",
                B.TRITON_TOKENS)
    return f.done()


def _serve_latency(f: Families, prefix: str, lb: Labels, view: EngineView) -> None:
    c = view.c
    # LLM-API finish reasons: stop, length, timeout, cancelled (client disconnects)
    for reason, key in (("stop", "success_stop"), ("length", "success_length"), ("cancelled", "aborted")):
        f.counter(f"{prefix}request_success_total", "Count of successfully processed requests.",
                  (*lb, ("finished_reason", reason)), c[key])
    f.histogram(f"{prefix}e2e_request_latency_seconds",
                "Histogram of end to end request latency in seconds.", lb, view, "e2e",
                B.VLLM_LATENCY)
    f.histogram(f"{prefix}time_to_first_token_seconds",
                "Histogram of time to first token in seconds.", lb, view, "ttft", B.VLLM_TTFT)
    f.histogram(f"{prefix}time_per_output_token_seconds",
                "Histogram of time per output token in seconds.", lb, view, "tpot_req",
                B.VLLM_ITL)
    f.histogram(f"{prefix}request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.", lb, view, "queue",
                B.VLLM_LATENCY)


@register(Dialect.TRTLLM_SERVE_GEN_A)
def serve_gen_a(views: Sequence[EngineView], model_name: str) -> list[Family]:
    """trtllm-serve before the ``trtllm_`` prefix: 5 request metrics, no KV metrics at all."""
    f = Families()
    _serve_latency(f, "", (("engine_type", "undefined"), ("model_name", "undefined")), views[0])
    return f.done()


@register(Dialect.TRTLLM_SERVE)
def serve(views: Sequence[EngineView], model_name: str) -> list[Family]:
    """trtllm-serve generation B (``trtllm_`` prefix, iteration and KV metrics)."""
    view = views[0]
    g, c, cfg = view.g, view.c, view.config
    f = Families()
    lb: Labels = (("engine_type", "pytorch"), ("model_name", model_name))
    active, queued = _active_queued(view)
    used = np.asarray(g["used_blocks"])
    gauges = (
        ("trtllm_kv_cache_utilization", "KV cache utilization (used / max blocks).",
         used / cfg.num_blocks),
        ("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks.",
         float(cfg.num_blocks)),
        ("trtllm_kv_cache_free_blocks", "Number of free KV cache blocks.", cfg.num_blocks - used),
        ("trtllm_kv_cache_used_blocks", "Number of used KV cache blocks.", used),
        ("trtllm_kv_cache_tokens_per_block", "Number of tokens per KV cache block.",
         float(cfg.block_size)),
        ("trtllm_num_requests_running", "Number of active requests.", active),
        ("trtllm_num_requests_waiting", "Number of queued requests.", queued),
        ("trtllm_num_scheduled_requests", "Number of scheduled requests.", g["running"]),
        ("trtllm_num_context_requests", "Number of context requests.", g["prefilling"]),
        ("trtllm_num_generation_requests", "Number of generation requests.", g["decoding"]),
        ("trtllm_num_paused_requests", "Number of paused requests.", g["paused"]),
        ("trtllm_max_num_active_requests", "Maximum number of active requests.",
         g["max_num_seqs"]),
        ("trtllm_iteration_latency_seconds", "Iteration latency in seconds.", g["itl"]),
    )
    for name, help_, value in gauges:
        f.gauge(name, help_, lb, value)
    f.counter("trtllm_prompt_tokens_total", "Number of prefill tokens processed.", lb,
              c["prompt_tokens"])
    f.counter("trtllm_generation_tokens_total", "Number of generation tokens processed.", lb,
              c["generation_tokens"])
    _serve_latency(f, "trtllm_", lb, view)
    return f.done()
