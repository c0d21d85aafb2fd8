"""NVIDIA Dynamo: the frontend (``dynamo_frontend_*``) and a worker's runtime metrics (``dynamo_component_*``).

Names and labels: ``ai-dynamo/dynamo:lib/runtime/src/metrics/prometheus_names.rs@04070c75``
(frontend_service, work_handler, kvstats) and the frontend's per-worker gauges (labels
``worker_id``, ``dp_rank``, ``worker_type``). The simulated deployment is one worker behind
its frontend; the worker does not re-export its engine's own metrics (when it does, it is
that engine's target). Histogram buckets are not fixed by the names file: the simulator
uses vLLM's TTFT/ITL boundaries.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvwatch.sim import buckets as B
from kvwatch.sim.expose import Families, Family, Labels, register
from kvwatch.sim.trace import EngineView
from kvwatch.sim.vocab import Dialect

_NS = (("dynamo_namespace", "dynamo"),)


@register(Dialect.DYNAMO_FRONTEND)
def frontend(views: Sequence[EngineView], model_name: str) -> list[Family]:
    view = views[0]
    g, c, cfg = view.g, view.c, view.config
    f = Families()
    lb: Labels = (("model", model_name),)
    running, waiting = np.asarray(g["running"], dtype=float), np.asarray(g["waiting"], dtype=float)
    prefilling = np.asarray(g["prefilling"], dtype=float)
    f.gauge("dynamo_frontend_inflight_requests", "Number of inflight requests", lb, running + waiting)
    f.gauge("dynamo_frontend_queued_requests", "Number of requests in HTTP processing queue", lb, waiting + prefilling)
    ok = np.asarray(c["success_stop"], dtype=float) + np.asarray(c["success_length"], dtype=float)
    for status, value in (("success", ok), ("error", np.asarray(c["aborted"], dtype=float))):
        f.counter("dynamo_frontend_requests_total", "Total number of LLM requests processed",
                  (*lb, ("request_type", "stream"), ("status", status)), value)
    f.counter("dynamo_frontend_output_tokens_total", "Total number of output tokens generated", lb,
              c["generation_tokens"])
    # end-to-end duration of each finished request (ai-dynamo/dynamo lib/llm/src/http/service/metrics.rs
    # `request_duration`); the buckets are the simulator's, its count is what kvwatch reads
    f.histogram("dynamo_frontend_request_duration_seconds", "Duration of LLM requests", lb, view, "e2e",
                B.VLLM_LATENCY)
    f.histogram("dynamo_frontend_time_to_first_token_seconds", "Time to first token in seconds", lb, view, "ttft",
                B.VLLM_TTFT)
    f.histogram("dynamo_frontend_inter_token_latency_seconds", "Inter-token latency in seconds", lb, view, "itl",
                B.VLLM_ITL)
    f.histogram("dynamo_frontend_input_sequence_tokens", "Input sequence length in tokens", lb, view,
                "prompt_tokens", B.vllm_token_buckets(cfg.max_model_len))
    for name, help_, value in (("model_total_kv_blocks", "Total KV blocks available for a worker serving the model",
                                float(cfg.num_blocks)),
                               ("model_kv_cache_block_size", "KV cache block size for a worker serving the model",
                                float(cfg.block_size)),
                               ("model_max_num_seqs", "Maximum number of sequences for a worker serving the model",
                                g["max_num_seqs"])):
        f.gauge(f"dynamo_frontend_{name}", help_, lb, value)
    worker: Labels = (("dp_rank", "0"), ("worker_id", "7587888283246421012"), ("worker_type", "decode"))
    f.gauge("dynamo_frontend_worker_active_decode_blocks", "Active KV cache decode blocks per worker", worker,
            g["used_blocks"])
    return f.done()


@register(Dialect.DYNAMO_WORKER)
def worker(views: Sequence[EngineView], model_name: str) -> list[Family]:
    view = views[0]
    g, c, cfg = view.g, view.c, view.config
    f = Families()
    comp: Labels = (("dynamo_component", "backend"), ("dynamo_endpoint", "generate"), *_NS)
    f.gauge("dynamo_component_inflight_requests", "Number of requests currently being processed", comp,
            np.asarray(g["running"], dtype=float) + np.asarray(g["waiting"], dtype=float))
    f.counter("dynamo_component_requests_total", "Total number of requests processed", comp, c["arrived"])
    f.counter("dynamo_component_errors_total", "Total number of errors in work handler processing",
              (*comp, ("error_type", "generate")), c["aborted"])
    kv: Labels = (("dp_rank", "0"), ("dynamo_component", "backend"), *_NS, ("model", model_name))
    f.gauge("dynamo_component_kvstats_gpu_cache_usage_percent", "GPU cache usage as a percentage (0.0-1.0)", kv,
            g["usage"])
    f.gauge("dynamo_component_kvstats_total_blocks", "Total number of KV cache blocks available", kv,
            float(cfg.num_blocks))
    return f.done()
