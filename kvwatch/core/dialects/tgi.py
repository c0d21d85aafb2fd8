"""Hugging Face Text Generation Inference sources."""

from __future__ import annotations

from kvwatch.core.dialects.compose import (
    HM,
    HQ,
    C,
    G,
    X,
    merge_sources,
    queue_occupancy,
    request_seconds,
    request_time_per_token,
)
from kvwatch.core.dialects.model import BY, Render, Source
from kvwatch.core.signals import Signal

_DECODE = 'method!="prefill"'  # the router's forward passes that decode ("decode", older "next_token")
_TGI_KV_PROXY = "batch token budget in use (tgi_batch_current_max_tokens / tgi_batch_max_total_tokens), not KV blocks"


def _tgi_decoded_per_s(r: Render, c: str) -> str:
    """Tokens decoded per second without the token histograms: the batch's mean size times its
    decode forward passes per second (each pass gives every request in the batch one token).
    The mean counts an idle batch's scrapes too, so a sparse pool's tokens are under-counted:
    against the exact request time per token on the base variant of 54 corpora, low-demand pools
    read 0.94-6.7x (median 1.28x), the rest 0.02-1.5x; the compute-bound rule's 0.25 s still
    parts them as the exact value does (1 of 80 low-demand pools over it, 24 of 27 compute-bound
    ones against 26)."""
    size = f"sum by ({BY}) (avg_over_time({r.sel('tgi_batch_current_size')}[{r.rw}]))"
    passes = f"sum by ({BY}) (rate({r.sel(f'tgi_batch_inference_count{c}', _DECODE)}[{r.rw}]))"
    return f"{size} * on ({BY}) {passes}"


def _tgi_per_pass(c: str) -> tuple[Source, Source]:
    """(tokens/s, request seconds per token) from forward passes, counter spelling ``c``."""
    count = f"tgi_batch_inference_count{c}"
    estimate = "batch size x decode forward passes/s: tokens counted per iteration"
    tokens = Source(X, "tgi_batch_current_size", expr=lambda r: _tgi_decoded_per_s(r, c),
                    extra_requires=(count,), estimate=estimate)
    per_token = Source(
        X, "tgi_request_duration_sum",
        expr=lambda r: (f"sum by ({BY}) ({request_seconds(r, 'tgi_request_duration')}) / on ({BY}) "
                        f"({_tgi_decoded_per_s(r, c)})"),
        extra_requires=("tgi_batch_current_size", count),
        estimate="router request time / (" + estimate + ")")
    return tokens, per_token


def tgi_sources() -> dict[Signal, tuple[Source, ...]]:
    """Text Generation Inference (Rust ``metrics`` crate; counters scraped with or without ``_total``).

    No KV gauge, no TTFT histogram, no preemption count. KV usage is a proxy: the
    largest token count the running batch may reach over the batch token budget
    (which TGI sizes from free GPU memory at warm-up, i.e. the KV pool).
    """
    per_pass = [_tgi_per_pass(c) for c in ("", "_total")]  # (tokens/s, s per token) per counter spelling
    return merge_sources(
        {
            Signal.KV_USAGE: Source(
                X, "tgi_batch_current_max_tokens",
                expr=lambda r: (f"max by ({BY}) ({r.gauge('tgi_batch_current_max_tokens')}) / on ({BY}) "
                                f"max by ({BY}) ({r.gauge('tgi_batch_max_total_tokens')} > 0)"),
                extra_requires=("tgi_batch_max_total_tokens",), proxy=_TGI_KV_PROXY,
                note="PROXY: " + _TGI_KV_PROXY,
            ),
            Signal.RUNNING: Source(G, "tgi_batch_current_size", agg="sum"),
            Signal.WAITING: (Source(G, "tgi_queue_size", agg="sum"), queue_occupancy("tgi_request_queue_duration")),
            Signal.QUEUE_P99: Source(HQ, "tgi_request_queue_duration", quantile=0.99),
            Signal.QUEUE_MEAN: Source(HM, "tgi_request_queue_duration"),
            Signal.ITL_MEAN: Source(HM, "tgi_request_mean_time_per_token_duration",
                                    note="mean of the requests' own means"),
            Signal.TPOT_P99: Source(HQ, "tgi_request_mean_time_per_token_duration", quantile=0.99,
                                    note="mean time per token of each request (TPOT)"),
            Signal.GEN_TPS: (
                Source(C, "tgi_request_generated_tokens_sum", agg="sum", counted_at_finish=True,
                       note="from the per-request histogram: counted at request end"),
                *(tokens for tokens, _ in per_pass),
            ),
            Signal.PROMPT_TPS: Source(C, "tgi_request_input_length_sum", agg="sum"),
            # tgi_request_count is incremented when a request arrives, tgi_request_success when it
            # completes (router/src/server.rs): finished requests are the second, created at the
            # first success, so a router that received requests and finished none reads 0, not blind
            Signal.REQUEST_RATE: tuple(
                Source(C, f"tgi_request_success{c}", agg="sum", lazy_anchor=f"tgi_request_count{c}",
                       counts_aborted=False, note="requests completed successfully")
                for c in ("", "_total")
            ),
            # created at the first failure; the request counter's spelling says which name it will have
            Signal.ABORT_RATE: tuple(
                Source(C, f"tgi_request_failure{c}", agg="sum", lazy_anchor=f"tgi_request_count{c}",
                       note="failures by err (validation, overloaded, ...)")
                for c in ("", "_total")
            ),
            # the router counts each forward pass as it starts it (backends/v3/src/backend.rs,
            # router/src/infer: method "prefill" or "decode", "next_token" in older docs); created at
            # the first pass, so a router that received requests and ran none reads 0, not blind
            Signal.STEP_RATE: tuple(
                Source(C, f"tgi_batch_inference_count{c}", _DECODE, agg="sum",
                       lazy_anchor=f"tgi_request_count{c}", note="decode forward passes per second")
                for c in ("", "_total")
            ),
            Signal.REQUEST_TIME_PER_TOKEN: (
                # the router's end-to-end time (validation, queue, inference: router/src/server.rs
                # records tgi_request_duration at each response) per token it generated; both
                # histograms are observed together when a request finishes
                request_time_per_token("tgi_request_duration", "tgi_request_generated_tokens_sum",
                                       note="router request time (queue included) / generated tokens (s per token)"),
                *(per_token for _, per_token in per_pass),
            ),
            Signal.KV_CAPACITY_TOKENS: Source(G, "tgi_batch_max_total_tokens",
                                              note="batch token budget set at warm-up from free memory"),
        },
    )
