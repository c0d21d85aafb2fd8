"""SGLang dialects: 0.5.x (``sglang:``) and the 0.3-0.4.0 set (§3); Ray Serve: expose_ray."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np

from kvwatch.sim import buckets as B
from kvwatch.sim.expose import Families, Family, Labels, register
from kvwatch.sim.trace import EngineView
from kvwatch.sim.vocab import Dialect


def _hit_rate(view: EngineView) -> object:
    q, h = np.asarray(view.c["prefix_queries"]), np.asarray(view.c["prefix_hits"])
    return np.divide(h, q, out=np.zeros_like(q, dtype=float), where=q > 0)


def _render(d: Dialect, views: Sequence[EngineView], model_name: str) -> list[Family]:
    view = views[0]
    g, c = view.g, view.c
    f = Families()
    p = "sglang:"
    tok: Labels = (("model_name", model_name),)  # tokenizer-manager metrics
    if d is Dialect.SGLANG_0_4_0:
        sched = tok
    else:  # scheduler metrics carry the engine and rank labels (>= 0.4.10)
        sched = (("engine_type", "unified"), ("model_name", model_name), ("pp_rank", "0"),
                 ("tp_rank", "0"))
        if d is Dialect.SGLANG_0_5:  # 0.5.23's real collector (conformance/) adds the EP rank
            sched = (*sched[:2], ("moe_ep_rank", "0"), *sched[2:])
    used_tokens = np.asarray(g["used_blocks"]) * view.config.block_size
    # the tokenizer manager adds a request's tokens when it finishes
    # (TokenizerMetricsCollector.observe_one_finished_request), not per step: the sums of the
    # finished requests' lengths, as the per-request histograms hold them
    f.counter(f"{p}prompt_tokens_total", "Number of prefill tokens processed.", tok,
              view.hist_sum("prompt_tokens"))
    f.counter(f"{p}generation_tokens_total", "Number of generation tokens processed.", tok,
              view.hist_sum("gen_tokens"))
    # rounded to 2 decimals by the 0.4 scheduler; 0.5.23 exports the ratio as computed
    usage = g["usage"] if d is Dialect.SGLANG_0_5 else np.round(g["usage"], 2)
    f.gauge(f"{p}token_usage", "The token usage.", sched, usage)
    f.gauge(f"{p}cache_hit_rate", "The prefix cache hit rate.", sched, _hit_rate(view))
    if d is Dialect.SGLANG_0_4_0:
        f.histogram(f"{p}time_to_first_token_seconds",
                    "Histogram of time to first token in seconds.", tok, view, "ttft",
                    B.SGLANG_TTFT_OLD)
        f.histogram(f"{p}e2e_request_latency_seconds",
                    "Histogram of End-to-end request latency in seconds", tok, view, "e2e",
                    B.SGLANG_E2E_OLD)
        f.histogram(f"{p}time_per_output_token_seconds",
                    "Histogram of time per output token in seconds.", tok, view, "itl",
                    B.SGLANG_TPOT_OLD)
    # logged after finishes, as vLLM's: the decode batch that ran (filtered of the previous step's
    # finished requests) or, at a prefill, the running batch before the refill (scheduler
    # log_decode_stats / log_prefill_stats), so a batch at its cap shows the cap less the refill
    f.gauge(f"{p}num_running_reqs", "The number of running requests.", sched, g["running_shown"])
    f.gauge(f"{p}num_used_tokens", "The number of used tokens.", sched, used_tokens)
    f.gauge(f"{p}gen_throughput", "The generation throughput (token/s).", sched, g["gen_tps"])
    f.gauge(f"{p}num_queue_reqs", "The number of requests in the waiting queue.", sched,
            g["waiting"])
    if d is Dialect.SGLANG_0_4_0:
        return f.done()
    f.gauge(f"{p}max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.",
            sched, float(view.config.num_blocks * view.config.block_size))
    f.counter(f"{p}num_retracted_requests_total", "Total number of retracted requests.", sched,
              c["preemptions"])
    f.histogram(f"{p}queue_time_seconds", "Histogram of queueing time in seconds.", sched, view,
                "queue", B.SGLANG_QUEUE)
    # the scheduler's own token count, live at every iteration (MetricsReporter →
    # increment_realtime_tokens), unlike the tokenizer's counts at request finish above
    # (a live server renders one instant: scalars; a hit never exceeds its prompt, so the
    # difference of the two running totals only grows)
    prompt, hits = np.asarray(c["prompt_tokens"], float), np.asarray(c["prefix_hits"], float)
    for mode, total in (("prefill_compute", np.maximum(prompt - hits, 0.0)),
                        ("prefill_cache", hits), ("decode", c["generation_tokens"])):
        f.counter(f"{p}realtime_tokens_total", "Total number of tokens processed (updated on each log "
                  "interval). mode: prefill_compute, prefill_cache, decode.", (*sched, ("mode", mode)), total)
    f.counter(f"{p}cached_tokens_total", "Number of cached prompt tokens.", tok, c["prefix_hits"])
    finished = (np.asarray(c["success_stop"]) + np.asarray(c["success_length"])
                + np.asarray(c["aborted"]))
    f.counter(f"{p}num_requests_total", "Number of requests processed.", tok, finished)
    f.counter(f"{p}num_aborted_requests_total", "Number of requests aborted.", tok, c["aborted"])
    f.histogram(f"{p}time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                tok, view, "ttft", B.SGLANG_TTFT)
    f.histogram(f"{p}inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                tok, view, "itl", B.SGLANG_ITL)
    # (finished - first token) / (completion tokens - 1) of each finished request (0.5.23's
    # TokenizerMetricsCollector, conformance/), on the inter-token latency's bounds
    f.histogram(f"{p}request_time_per_output_token_seconds", "Per-request TPOT in seconds: (finished_time - "
                "first_token_time) / (completion_tokens - 1).", tok, view, "tpot_req", B.SGLANG_ITL)
    f.histogram(f"{p}e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds", tok, view, "e2e",
                B.SGLANG_E2E)
    return f.done()


for _dialect in (Dialect.SGLANG_0_5, Dialect.SGLANG_0_4_0):
    register(_dialect)(partial(_render, _dialect))


def render_0_5(views: Sequence[EngineView], model_name: str) -> list[Family]:
    """The native 0.5.x families (the Ray wrapper re-exports exactly these)."""
    return _render(Dialect.SGLANG_0_5, views, model_name)
