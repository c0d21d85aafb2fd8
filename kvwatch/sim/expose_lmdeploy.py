"""LMDeploy (``lmdeploy:``): the PrometheusStatLogger families, vLLM-shaped.

Source: ``InternLM/lmdeploy:lmdeploy/metrics/loggers.py@1263d5cd``. Labels ``model_name`` and
``engine`` (the data-parallel rank as a string); ``_created`` series are disabled;
``request_success_total`` is created for every ``ResponseType`` at start, its label is
``str(ResponseType.X)``. ``time_per_output_token_seconds`` is one value per finished
request, ``iter_token_latency`` one per output step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvwatch.sim import buckets as B
from kvwatch.sim.expose import Families, Family, Labels, register
from kvwatch.sim.trace import EngineView
from kvwatch.sim.vocab import Dialect

P = "lmdeploy:"
_REASONS = ("SUCCESS", "FINISH", "ENGINE_STOP_ERROR", "SESSION_REPEAT", "SESSION_NOT_EXIST", "HANDLER_NOT_EXIST",
            "INPUT_LENGTH_ERROR", "INTERNAL_ENGINE_ERROR", "CANCEL", "PREFIX_CACHE_CONFLICT", "NO_QUEUE",
            "NOT_SUPPORTED", "OUT_OF_MEMORY")
#: which simulated finish counts under which ResponseType (stop and length both finish normally)
_COUNTED = {"FINISH": ("success_stop", "success_length"), "CANCEL": ("aborted",)}


@register(Dialect.LMDEPLOY)
def render(views: Sequence[EngineView], model_name: str) -> list[Family]:
    f = Families()
    for i, view in enumerate(views):
        g, c = view.g, view.c
        lb: Labels = (("engine", str(i)), ("model_name", model_name))
        q, h = np.asarray(c["prefix_queries"], dtype=float), np.asarray(c["prefix_hits"], dtype=float)
        gauges = (
            ("num_requests_succeeded", "Number of current succeeded requests.", 0.0),
            ("num_requests_failed", "Number of current failed requests.", 0.0),
            ("num_api_requests_routed", "Number of requests routed to request handles.", g["running"]),
            ("num_api_requests_waiting", "Number of requests waiting for free request handles.", 0.0),
            ("num_requests_running", "Number of requests in model execution batches.", g["running"]),
            ("num_requests_waiting", "Number of requests waiting to be processed.", g["waiting"]),
            ("gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", g["usage"]),
            ("prefix_cache_hit_rate", "Prefix-cache hit rate. 1 means 100 percent of queried prefix tokens hit.",
             np.divide(h, q, out=np.zeros_like(q), where=q > 0)),
        )
        for name, help_, value in gauges:
            f.gauge(f"{P}{name}", help_, lb, value)
        f.counter(f"{P}prompt_tokens_total", "Number of prefill tokens processed.", lb, c["prompt_tokens"])
        f.counter(f"{P}generation_tokens_total", "Number of generation tokens processed.", lb,
                  c["generation_tokens"])
        f.counter(f"{P}cached_tokens_total", "Total number of cached tokens.", lb, c["prefix_hits"])
        for reason in _REASONS:
            keys = _COUNTED.get(reason, ())
            value = sum((np.asarray(c[k], dtype=float) for k in keys), np.zeros_like(np.asarray(c["aborted"],
                                                                                                 dtype=float)))
            f.counter(f"{P}request_success_total", "Count of successfully processed requests.",
                      (*lb, ("finished_reason", f"ResponseType.{reason}")), value)
        tok = B.vllm_token_buckets(view.config.max_model_len)
        f.histogram(f"{P}request_prompt_tokens", "Number of prefill tokens processed.", lb, view, "prompt_tokens", tok)
        f.histogram(f"{P}request_generation_tokens", "Number of generation tokens processed.", lb, view,
                    "gen_tokens", tok)
        f.histogram(f"{P}time_to_first_token_seconds", "Histogram of time to first token in seconds.", lb, view,
                    "ttft", B.VLLM_TTFT)
        f.histogram(f"{P}time_per_output_token_seconds", "Histogram of time per output token in seconds.", lb,
                    view, "tpot_req", B.LMDEPLOY_ITL)
        f.histogram(f"{P}iter_token_latency", "Histogram of inter-token latency", lb, view, "itl", B.LMDEPLOY_ITL)
        f.histogram(f"{P}e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lb, view,
                    "e2e", B.VLLM_LATENCY)
        f.histogram(f"{P}request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", lb,
                    view, "queue", B.VLLM_LATENCY)
    return f.done()
