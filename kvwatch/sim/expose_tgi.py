"""Hugging Face TGI: the router's ``tgi_*`` metrics (Rust ``metrics`` crate exporter).

Sources: ``huggingface/text-generation-inference:docs/source/reference/metrics.md@53fdbe61``,
``router/src/server.rs`` (histogram buckets), ``backends/v3/src/lib.rs``
(``tgi_batch_max_total_tokens``). Counters carry no ``_total``; there is no KV gauge,
no TTFT histogram and no preemption count. ``tgi_batch_current_max_tokens`` is the token
count the running batch may grow to (prompt + max new tokens per request), which the
simulator reads off the blocks it has allocated.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvwatch.sim import buckets as B
from kvwatch.sim.expose import Families, Family, Labels, register
from kvwatch.sim.trace import EngineView
from kvwatch.sim.vocab import Dialect


@register(Dialect.TGI)
def render(views: Sequence[EngineView], model_name: str) -> list[Family]:
    view = views[0]
    g, c, cfg = view.g, view.c, view.config
    f = Families()
    lb: Labels = ()
    f.gauge("tgi_queue_size", "Current queue size", lb, g["waiting"])
    f.gauge("tgi_batch_current_size", "Current batch size", lb, g["running"])
    f.gauge("tgi_batch_current_max_tokens", "Maximum tokens for the current batch", lb,
            np.asarray(g["alloc_blocks"], dtype=float) * cfg.block_size)
    f.gauge("tgi_batch_max_total_tokens", "Maximum total tokens of a batch", lb,
            float(cfg.num_blocks * cfg.block_size))
    ok = np.asarray(c["success_stop"], dtype=float) + np.asarray(c["success_length"], dtype=float)
    f.counter("tgi_request_count", "Total number of requests", lb, c["arrived"])
    f.counter("tgi_request_success", "Number of successful requests", lb, ok)
    f.counter("tgi_request_failure", "Number of failed requests", (("err", "cancelled"),), c["aborted"])
    # forward passes as the router starts them: one decode pass per engine iteration, and (an
    # upper bound: TGI batches the requests it admits together) one prefill pass per request
    f.counter("tgi_batch_inference_count", "Inference calls per method", (("method", "prefill"),), c["arrived"])
    f.counter("tgi_batch_inference_count", "Inference calls per method", (("method", "decode"),),
              np.floor(np.asarray(c["iterations"], dtype=float)))
    f.histogram("tgi_request_queue_duration", "Time spent in the queue per request", lb, view, "queue",
                B.TGI_DURATION)
    f.histogram("tgi_request_mean_time_per_token_duration", "Mean time per token per request", lb, view,
                "tpot_req", B.TGI_DURATION)
    f.histogram("tgi_request_duration", "Total time spent processing the request", lb, view, "e2e",
                B.TGI_DURATION)
    f.histogram("tgi_request_input_length", "Input token length per request", lb, view, "prompt_tokens",
                B.TGI_INPUT)
    f.histogram("tgi_request_generated_tokens", "Generated tokens per request", lb, view, "gen_tokens",
                B.TGI_GENERATED)
    return f.done()
