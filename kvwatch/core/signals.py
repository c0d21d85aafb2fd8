"""Canonical, engine-neutral signals.

The classifier speaks only these names; which PromQL produces each one for a
given engine lives in :mod:`kvwatch.core.dialects`. Units are stated per signal.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Signal(StrEnum):
    """A canonical signal; the value is the name used in rules and JSON."""

    KV_USAGE = "kv_usage"
    RUNNING = "running"
    WAITING = "waiting"
    WAITING_CAPACITY = "waiting_capacity"
    PREEMPTIONS = "preemptions"
    TTFT_P50 = "ttft_p50"
    TTFT_P99 = "ttft_p99"
    TTFT_MEAN = "ttft_mean"
    QUEUE_P99 = "queue_p99"
    QUEUE_MEAN = "queue_mean"
    ITL_P99 = "itl_p99"
    ITL_MEAN = "itl_mean"
    TPOT_P99 = "tpot_p99"
    GEN_TPS = "gen_tps"
    PROMPT_TPS = "prompt_tps"
    REQUEST_RATE = "request_rate"
    ABORT_RATE = "abort_rate"
    KV_CAPACITY_TOKENS = "kv_capacity_tokens"
    MAX_RUNNING = "max_running"
    STEP_RATE = "step_rate"
    REQUEST_TIME_PER_TOKEN = "request_time_per_token"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class SignalInfo:
    """Static facts about a signal: unit and whether it is a time series or a static value."""

    unit: str
    description: str
    static: bool = False


SIGNAL_INFO: dict[Signal, SignalInfo] = {
    Signal.KV_USAGE: SignalInfo("ratio", "fraction 0-1 of KV blocks/tokens in use (max over DP engines)"),
    Signal.RUNNING: SignalInfo("requests", "requests in the running batch"),
    Signal.WAITING: SignalInfo("requests", "requests waiting to be scheduled"),
    Signal.WAITING_CAPACITY: SignalInfo("requests", "waiting because of KV capacity (vLLM >= 0.20.2)"),
    Signal.PREEMPTIONS: SignalInfo(
        "1/s",
        "preemptions/retractions per second (events/s from every engine)",
    ),
    Signal.TTFT_P50: SignalInfo("s", "time to first token, median over the rate window"),
    Signal.TTFT_P99: SignalInfo("s", "time to first token, 99th percentile over the rate window"),
    Signal.TTFT_MEAN: SignalInfo("s", "time to first token, windowed mean rate(sum)/rate(count)"),
    Signal.QUEUE_P99: SignalInfo("s", "queue time, 99th percentile (observed at request finish)"),
    Signal.QUEUE_MEAN: SignalInfo("s", "queue time, windowed mean"),
    Signal.ITL_P99: SignalInfo("s", "inter-token latency (one observation per output step), 99th percentile"),
    Signal.ITL_MEAN: SignalInfo(
        "s", "mean time between a request's output tokens, windowed rate(sum)/rate(count): one engine step "
             "(a per-request time-per-token histogram gives the same mean); read only where no token counter is "
             "exported (ONLY_WITHOUT), for the requests that finish in one step",
    ),
    Signal.TPOT_P99: SignalInfo(
        "s", "per-request mean time per output token, 99th percentile over requests (understates the ITL tail)"
    ),
    Signal.GEN_TPS: SignalInfo("tokens/s", "generated tokens per second"),
    Signal.PROMPT_TPS: SignalInfo("tokens/s", "prompt tokens per second"),
    Signal.REQUEST_RATE: SignalInfo("requests/s", "finished requests per second"),
    Signal.ABORT_RATE: SignalInfo("requests/s", "aborted or failed requests per second"),
    Signal.KV_CAPACITY_TOKENS: SignalInfo("tokens", "KV pool size the engine reports", static=True),
    Signal.MAX_RUNNING: SignalInfo("requests", "configured max concurrent requests", static=True),
    Signal.STEP_RATE: SignalInfo(
        "1/s", "forward passes (scheduler iterations) per second, counted as they run; read where the "
               "tokens are counted only as requests finish (TGI, Triton), to tell a wedge from long requests",
    ),
    Signal.REQUEST_TIME_PER_TOKEN: SignalInfo(
        "s", "end-to-end request time per output token, windowed: request seconds / output tokens (queue time "
             "included); read only where no TTFT is exported (Triton, TGI, a relabel that dropped it: ONLY_WITHOUT) to "
             "tell a slow engine from an idle one",
    ),
}

#: Signals without which no state can be decided: their absence makes a target ``unknown``.
REQUIRED_SIGNALS: tuple[Signal, ...] = (Signal.KV_USAGE,)

#: signal -> the signal it stands in for: read only from targets that do not export the latter.
#: Fetching it from every target would cost each cycle a query and a series per target for
#: nothing (the tokens per second give the step where they are counted; the rule that reads the
#: request time per token, compute-bound without TTFT, needs no TTFT exported).
ONLY_WITHOUT: dict[Signal, Signal] = {Signal.ITL_MEAN: Signal.GEN_TPS, Signal.REQUEST_TIME_PER_TOKEN: Signal.TTFT_P50}
