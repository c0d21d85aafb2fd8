"""Capacity facts of one target: tokens used and free, tokens per request, headroom, periodicity.

Facts are scalars that rules compare against (``fact: headroom_requests``) and
that triage text quotes; replica-group facts from :mod:`.groups` are merged in.
"""

from __future__ import annotations

import math

from kvwatch.core.diagnose.view import TargetView
from kvwatch.core.dialects import (
    SourceKind,
    resolve,
    running_after_finishes,
    tokens_counted_at_finish,
    waiting_counts_prefill,
    waiting_is_estimate,
    waiting_shows_stalls,
)
from kvwatch.core.signals import Signal
from kvwatch.core.statistics.series import safe_ratio

#: oscillating's recency (s): the pressure of the last 10 minutes is what the engine did, as
#: the rule's queue-gauge branch reads it (``waiting.since_above(1) <= 600``)
OSCILLATION_RECENCY_S = 600.0
#: the span (s) a queue's trend is read over for ``queue_drain_share``: the `for` of the rules that
#: ask whether a replica is draining its own backlog
DRAIN_SPAN_S = 600.0


def facts_for(view: TargetView, group: dict[str, float | None]) -> dict[str, float | None]:
    """Scalar facts used by rules and triage text: capacity math and headroom in tokens and requests."""
    p = view.p
    w = p.window_s
    cap = view.stat("kv_capacity_tokens", w, "last")
    u_now = view.stat("kv_usage", p.fresh_s, "last")
    used = None if cap is None or u_now is None else cap * u_now
    headroom = None if cap is None or u_now is None else cap * (1 - u_now)
    prompt, gen, reqs = (view.stat(s, w, "mean") for s in ("prompt_tps", "gen_tps", "request_rate"))
    per_req = None if prompt is None or gen is None else safe_ratio(prompt + gen, reqs)
    # the periodogram and the swing walk are per series: only swinging pools need them
    swinging = (view.stat("kv_usage", w, "std") or 0.0) >= 0.05
    ws = view.stats("kv_usage", w) if swinging else None
    period = ws.period if ws is not None and (ws.periodicity or 0) >= 0.2 else None
    if period is None and not swinging:
        # a small max_num_seqs carries the cycle while a huge pool barely moves: the batch's
        # fill and drain has the period then (held-out rnd-146-052, KV under 1 %)
        rs = view.stats("running", w)
        if rs is not None and (rs.fill_drain() or 0) >= 2 and (rs.periodicity or 0) >= 0.2:
            period = rs.period
    if period is not None and period > w / 2:
        # the periodogram's lowest bins (the whole window, half of it) are a trend or one
        # drain, not a cycle: a period needs two of its cycles in the window (rnd-153-022)
        period = None
    cycles = ws.cycles(0.8, 0.4) if ws is not None else (0 if view.stat("kv_usage", w, "count") else None)
    return {
        "capacity_tokens": cap,
        "used_tokens": used,
        "headroom_tokens": headroom,
        "tokens_per_request": per_req,
        "headroom_requests": safe_ratio(headroom, per_req),
        "capacity_requests": safe_ratio(cap, per_req),
        "max_running": view.stat("max_running", w, "last"),
        "ttft_slo": p.ttft_slo_s,
        **_cap_dips(_finishes_per_step(view)),
        "waiting_counts_prefill": 1.0 if waiting_counts_prefill(view.target.dialect) else 0.0,
        "waiting_estimated": 1.0 if waiting_is_estimate(view.target) else 0.0,
        "tokens_at_finish": 1.0 if tokens_counted_at_finish(view.target) else 0.0,
        # no number where the queue reading cannot show a wedge: a rule comparing it is undecidable
        "queue_shows_stalls": 1.0 if waiting_shows_stalls(view.target) else None,
        "latency_reach_s": p.latency_reach_s,
        "latency_requests": _latency_requests(view),
        "queue_drain_share": _queue_drain_share(view),
        "queue_reach_s": p.latency_reach_s - _estimate_lag_s(view),
        # a preemption rate reads an event for a rate window after it (every dialect's
        # preemptions are a rate or a rate-window mean)
        "preemption_reach_s": p.latency_reach_s - view.data.rate_window(view.key),
        "queue_mean_recency_s": max(0.0, OSCILLATION_RECENCY_S - _queue_mean_span_s(view)),
        "period": period,
        "period_minutes": None if period is None else period / 60,
        "kv_cycles": None if cycles is None else float(cycles),
        "group_size": 1.0,
        "group_kv_usage_median": None,
        "group_kv_usage_mean": None,
        "kv_usage_vs_group": None,
        **group,
    }


#: the span (s) the completions per step are read over: batch-limited's own (``for: 10m``)
FINISHES_SPAN_S = 600.0


def _finishes_per_step(view: TargetView) -> float | None:
    """Requests that finish in one engine step, as a running gauge read after the step misses
    them (λ: a batch held at its cap reads the cap with probability e^-λ). Each decoding request
    emits one token per step, so a step lasts running / tokens-per-second and λ = finished/s x
    running / tokens/s (medians over the last 10 minutes; speculative decoding's extra tokens per
    step only lower it). Without a token counter the step is the mean time between a request's
    output tokens (``itl_mean``; a prefill chunk or an eviction in between only lengthens it, so
    λ errs high: the dip a cap may show, wider). 0 where the gauge counts the step's finished
    requests (the cap itself is read); None where the counters or the latency are missing."""
    if not running_after_finishes(view.target):
        return 0.0
    running, done, tokens = (view.stat(s, FINISHES_SPAN_S, "median")
                             for s in ("running", "request_rate", "gen_tps"))
    if done is None:
        return None
    if tokens is None:
        step = view.stat("itl_mean", FINISHES_SPAN_S, "median")
        return done * step if step is not None and step > 0 else None
    if running is None or tokens <= 0:
        return None
    return running * done / tokens


def _cap_dips(lam: float | None) -> dict[str, float | None]:
    """``finishes_per_step`` (λ) and what a batch at its cap then looks like on a gauge read after
    the step's finished requests left: ``finish_dip``, how far under the cap its 10th percentile
    may sit (Poisson(λ)'s 90th percentile with the noise of 21 samples), and ``cap_share``, the least
    share of samples at the cap itself (e^-λ less 2.5 sd of 21 samples). λ 0 (the gauge keeps the
    finished requests): no dip, every sample at the cap; λ unknown: neither is known."""
    if lam is None:
        return {"finishes_per_step": None, "finish_dip": None, "cap_share": None}
    if lam <= 0:
        return {"finishes_per_step": 0.0, "finish_dip": 0.0, "cap_share": 1.0}
    return {"finishes_per_step": lam, "finish_dip": lam + 2 * math.sqrt(lam) + 1,
            "cap_share": max(0.0, math.exp(-lam) - 0.25)}


def _estimate_lag_s(view: TargetView) -> float:
    """How long a Little's-law queue estimate outlasts the queue it reads (s): its rate window,
    since a request's wait is counted when it leaves the queue; 0 behind a queue gauge."""
    if not waiting_is_estimate(view.target):
        return 0.0
    return view.data.rate_window(view.key)


def _queue_mean_span_s(view: TargetView) -> float:
    """The span (s) the target's queue-time mean averages over, so how long it still reads a
    queue that ended: the latency window (and the sample's age) for a histogram mean, the rate
    window for a counter ratio (Triton), none for a gauge (SGLang's last-batch latency)."""
    src = resolve(view.target).get(Signal.QUEUE_MEAN)
    if src is None or src.kind is SourceKind.GAUGE:
        return 0.0
    if src.kind is SourceKind.HIST_MEAN:
        return view.p.latency_reach_s
    return view.data.rate_window(view.key)


def _queue_drain_share(view: TargetView) -> float | None:
    """The share of the queue its trend over the last :data:`DRAIN_SPAN_S` removes per minute
    (its least-squares fall per minute over the requests waiting now, at least one): 0.1 or more
    empties it within 10 minutes, 0 where it holds or grows; None without a queue reading. A
    backlog is being drained when this is large: a slope alone cannot say so, as 6 requests a
    minute off 2,900 waiting is 0.002 (five hours: the demo's saturated replica), off 40 it is 0.15."""
    last = view.stat("waiting", DRAIN_SPAN_S, "last")
    slope = view.stat("waiting", DRAIN_SPAN_S, "slope")  # requests per minute
    if last is None or slope is None:
        return None
    return max(0.0, -slope) / max(last, 1.0)  # (0.0 first: a flat queue reads 0, not -0)


def _latency_requests(view: TargetView) -> float | None:
    """Requests the newest latency quantile summarises: the finished-request rate over the latency
    window times that window. None without a request counter, or where it reads none (a lazily
    created counter that is absent reads 0, yet the quantile summarises requests). A p99 of a
    dozen requests is their slowest one, not a tail."""
    lw = view.p.latency_window_s
    rate = view.stat("request_rate", lw, "mean")
    return None if rate is None or rate <= 0 else rate * lw
