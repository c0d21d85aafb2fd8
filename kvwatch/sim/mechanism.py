"""Label a simulated engine by the limit that binds in its ground truth, not by rule thresholds.

Every step the engine records why the head of its queue was not admitted (``blocked``:
slots = ``max_num_seqs``, KV = the blocks are physically taken, policy = blocks are free
but a reservation or watermark holds them back, stalled = the scheduler is wedged) and its
preemptions. The label of a run is read from that record over the last ``window_s``:

* **stalled** (idle): the scheduler is wedged for the last ``recent_s`` with requests queued;
* **oscillating**: at least three pressure episodes (a limit binds: queue or preemptions)
  separated by drains (nothing binds, the batch falls to under half its peak and the pool
  well below its peak), recurring with a period (the gaps between their starts vary by
  at most ``PERIOD_CV``), the last one within ``recent_s``;
* **full**: KV blocks exhausted (queue held back by taken blocks, or preemptions) in most
  of ``recent_s``;
* **fragmented**: free blocks held back by the admission policy in most of ``recent_s``;
* **batch-limited** (idle): ``max_num_seqs`` binds in most of ``recent_s`` with KV free;
* with no limit binding in ``recent_s``: **compute-bound** (idle) when the typical request's
  TTFT (per-request truth) breaks the SLO, **misread** when the mean is fine but a slice of
  requests breaks it, **low demand** (idle) when the pool stays nearly empty with no
  sustained queue anywhere in the window, else **healthy** (which includes pools that
  recovered from an earlier episode, empty ones too: they were short of capacity minutes ago). The TTFT truth is read on
  the requests that *arrived* in ``recent_s``, outside sustained pressure (30 s bins with
  a queue or preemptions half the time): a request that queued in an episode carries that
  episode's tail, not the workload's. Misread needs the
  slow share clearly over 1 % (the p99 is over the SLO not by a Poisson draw, see
  :func:`_slice_band`) and over 1 % in both halves of ``recent_s`` (it persists); a slow
  share within the draw's reach of 1 %, or a tail in one half only, is ambiguous.

A run that fits none cleanly (pressure in part of the span only, several limits taking
turns, a limit that stopped binding in the last minute, a pool on the border of "nearly
empty", a slow slice near 1 % of the requests or in part of the recent span only) is *ambiguous*: the generator redraws it, and
says how often. Precedence follows failure-modes.md. Units: seconds, fractions of steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvwatch.sim.trace import (
    BLOCKED_KV,
    BLOCKED_POLICY,
    BLOCKED_SLOTS,
    BLOCKED_STALLED,
    Trace,
)
from kvwatch.sim.vocab import PRECEDENCE, IdleCause, Mode

WINDOW_S = 1800.0
RECENT_S = 600.0
TTFT_SLO_S = 2.0
BINDS = 0.6  # a limit "binds" when it holds the queue in this share of the recent steps
QUIET = 0.05  # at most this share of recent steps with a queue or a preemption: nothing binds
LOW_USAGE = (0.12, 0.20)  # p90 KV usage below: nearly empty; inside: too close to call
_BIN_S = 30  # pressure episodes are read on 30 s bins
PERIOD_CV = 0.35  # episodes recur with a period: spread of the gaps between their starts


@dataclass(frozen=True)
class Label:
    """Mode (and idle cause) of one engine, the mechanism behind it, or why it is ambiguous."""

    mode: Mode | None
    cause: IdleCause | None
    mechanism: str
    evidence: dict[str, float]
    #: for a misread label: the label the pool would have without its TTFT tail
    #: ("idle/low_demand", "healthy"; None when that is too close to call), which is all an
    #: engine without a TTFT histogram can show (see :mod:`kvwatch.sim.honest`)
    without_tail: str | None = None

    @property
    def ambiguous(self) -> bool:
        return self.mode is None


def _episodes(hot: np.ndarray, drained: np.ndarray) -> tuple[list[int], int]:
    """Start bins of pressure episodes that follow a drain (the first episode counts when no
    drain was seen before it), and bins since the last hot bin, on 30 s bins."""
    starts: list[int] = []
    seen_drain, in_hot, last_hot = False, False, -1
    for i, (h, d) in enumerate(zip(hot.tolist(), drained.tolist(), strict=True)):
        if h:
            if not in_hot and (seen_drain or (not starts and last_hot < 0)):
                starts.append(i)
                seen_drain = False
            in_hot, last_hot = True, i
        else:
            in_hot = False
            if d:
                seen_drain = True
    return starts, (len(hot) - 1 - last_hot) if last_hot >= 0 else len(hot)


def _bins(x: np.ndarray, fn: str = "mean") -> np.ndarray:
    n = len(x) // _BIN_S
    v = x[len(x) - n * _BIN_S:].reshape(n, _BIN_S)
    return getattr(v, fn)(axis=1)


def _calm_ttft(trace: Trace, sustained: np.ndarray, start: float, end: float) -> tuple[np.ndarray, np.ndarray]:
    """TTFT (s) of the requests that *arrived* in ``(start, end]``, except at steps inside a
    sustained pressure episode (``sustained``: per step, aligned with the last
    ``len(sustained)`` steps of the trace). Selecting by first-token time instead would
    count requests that queued in an episode that ended before ``start`` (their first token
    comes later): the tail of a recovered episode is not a slice of the workload. Brief
    queue blips stay in: their tail is part of the pool's current regime. Requests whose
    first token has not come by ``end`` are not counted (their TTFT is unknown).
    Returns (arrival times, TTFT), s."""
    arrival = trace.ttft_at - trace.ttft
    sel = (arrival > start) & (trace.ttft_at <= end)
    t_win = trace.t[len(trace.t) - len(sustained):]
    idx = np.clip(np.searchsorted(t_win, arrival[sel], side="right") - 1, 0, len(t_win) - 1)
    keep = ~sustained[idx]
    return arrival[sel][keep], trace.ttft[sel][keep]


def _slice_band(n: float) -> tuple[float, float]:
    """Counts of slow requests (of ``n``) that are clearly under / over 1 % of them.

    The p99 is over the SLO exactly when more than 1 % of the requests are slow; with a
    slice near 1 % which side the p99 of a 10-minute span lands on is a Poisson draw (sd of
    the count ≈ sqrt(0.01 n)), not a property of the engine: within two sd the truth is too
    close to call."""
    mean = 0.01 * n
    sd = float(np.sqrt(max(mean, 1e-9)))
    return mean - 2 * sd, mean + 2 * sd


def label_trace(trace: Trace, *, window_s: float = WINDOW_S, recent_s: float = RECENT_S,
                ttft_slo_s: float = TTFT_SLO_S) -> Label:
    """The mechanism label of one engine at the end of its trace (1 s steps)."""
    end = trace.t[-1]
    sel = trace.t > end - window_s
    rec = trace.t[sel] > end - recent_s
    waiting = trace.gauge("waiting")[sel]
    blocked = trace.gauge("blocked")[sel].astype(int)
    usage = trace.gauge("usage")[sel]
    running = trace.gauge("running")[sel]
    pre = np.diff(trace.counter("preemptions")[sel], prepend=trace.counter("preemptions")[sel][0]) > 0
    queued = waiting > 0
    pressure = queued | pre
    ev = {
        "wait": float(queued[rec].mean()),
        "kv": float(((queued & (blocked == BLOCKED_KV)) | pre)[rec].mean()),
        "slots": float((queued & (blocked == BLOCKED_SLOTS))[rec].mean()),
        "policy": float((queued & (blocked == BLOCKED_POLICY))[rec].mean()),
        "stalled": float((blocked == BLOCKED_STALLED)[rec].mean()),
        "usage_p90": float(np.quantile(usage, 0.9)),
        "usage_p90_recent": float(np.quantile(usage[rec], 0.9)),
    }
    # fill-and-drain: pressure episodes separated by drains of the batch (and of the pool)
    hot = _bins(pressure.astype(float)) >= 0.5
    peak_run = max(float(np.quantile(running, 0.95)), 1.0)
    peak_use = max(float(np.quantile(usage, 0.95)), 1e-6)
    drained = ((_bins(pressure.astype(float)) == 0)
               & (_bins(running) <= 0.5 * peak_run) & (_bins(usage) <= 0.6 * peak_use))
    starts, since_hot = _episodes(hot, drained)
    gaps = np.diff(starts)
    ev["episodes"] = float(len(starts))
    ev["period_cv"] = float(gaps.std() / gaps.mean()) if len(gaps) >= 2 else float("nan")
    sustained = np.zeros(len(pressure), dtype=bool)  # steps inside a hot 30 s bin
    sustained[len(pressure) - len(hot) * _BIN_S:] = np.repeat(hot, _BIN_S)
    arrived, ttft = _calm_ttft(trace, sustained, end - recent_s, end)
    if len(ttft) >= 10:
        slow = ttft > ttft_slo_s
        early = arrived <= end - recent_s / 2
        ev.update(ttft_p50=float(np.quantile(ttft, 0.5)), ttft_p99=float(np.quantile(ttft, 0.99)),
                  ttft_mean=float(ttft.mean()), ttft_slow=float(slow.mean()),
                  ttft_n=float(len(ttft)), ttft_slow_n=float(slow.sum()),
                  # slow share in the older and the newer half of the recent span: a slice of
                  # the workload shows in both, a tail that began 3 minutes ago does not yet
                  ttft_slow_halves=float(min(slow[early].mean() if early.any() else 0.0,
                                             slow[~early].mean() if (~early).any() else 0.0)))
    recent_bins = recent_s / _BIN_S

    def lab(mode: Mode | None, cause: IdleCause | None, mech: str) -> Label:
        return Label(mode, cause, mech, ev)

    if ev["stalled"] >= 0.95:
        return lab(Mode.IDLE, IdleCause.STALLED, "scheduler wedged with requests queued")
    if ev["stalled"] > 0:
        return lab(None, None, "wedged for part of the recent span only")
    if len(starts) >= 3 and since_hot < recent_bins:
        if ev["period_cv"] <= PERIOD_CV:
            limit = "KV" if ev["kv"] >= ev["slots"] else "max_num_seqs"
            return lab(Mode.OSCILLATING, None,
                       f"{len(starts)} fill-and-drain cycles with pressure at the peaks ({limit}),"
                       f" period {float(np.mean(gaps)) * _BIN_S / 60:.1f} min")
        return lab(None, None, "pressure comes and goes without a period")
    if len(starts) >= 2 and ev["wait"] > QUIET:
        return lab(None, None, "pressure comes and goes, fewer than three cycles")
    ev["pressure_now"] = float(pressure[-60:].mean())
    if max(ev["kv"], ev["policy"], ev["slots"]) >= BINDS and ev["pressure_now"] == 0:
        return lab(None, None, "the limit bound until the last minute: recovering")
    if ev["kv"] >= BINDS:
        return lab(Mode.FULL, None, "KV blocks exhausted: queue held back by taken blocks or preemptions")
    if ev["policy"] >= BINDS:
        return lab(Mode.FRAGMENTED, None, "free blocks held back by the admission policy (reservation/watermark)")
    if ev["slots"] >= BINDS:
        if ev["usage_p90_recent"] >= 0.7:
            return lab(None, None, "max_num_seqs binds on a busy pool")
        return lab(Mode.IDLE, IdleCause.BATCH_LIMITED, "max_num_seqs binds while KV blocks are free")
    if ev["wait"] > QUIET or ev["kv"] > QUIET:
        return lab(None, None, "a queue in part of the recent span, no single limit binding")
    lo, hi = LOW_USAGE
    # low demand is "over-provisioned, no queue" over the window: a pool that queued requests
    # in a sustained episode earlier in the window was short of capacity then, and is a
    # recovered (healthy) pool now, however empty it looks
    ev["queued_earlier"] = float(hot.any())
    nearly_empty = ev["usage_p90"] <= lo and not hot.any()
    recovered_empty = ev["usage_p90"] <= lo and hot.any()
    if "ttft_p50" not in ev:
        if nearly_empty:
            return lab(Mode.IDLE, IdleCause.LOW_DEMAND, "arrivals far below capacity")
        if recovered_empty:
            return lab(Mode.HEALTHY, None, "recovered from a queue episode earlier in the window")
        return lab(None, None, "too few requests to read latency")
    if ev["ttft_p50"] >= ttft_slo_s:
        if ev["usage_p90"] <= 0.5:
            return lab(Mode.IDLE, IdleCause.COMPUTE_BOUND, "typical request slow to first token without a queue")
        return lab(None, None, "slow first tokens on a busy pool")
    slice_lo, slice_hi = _slice_band(ev["ttft_n"])
    if ev["ttft_p99"] > ttft_slo_s and ev["ttft_mean"] <= ttft_slo_s and ev["ttft_p50"] <= ttft_slo_s / 4:
        if ev["ttft_slow_halves"] <= 0.01:
            return lab(None, None, "tail over the SLO in part of the recent span only")
        if ev["ttft_slow_n"] >= slice_hi and ev["ttft_slow"] <= 0.2:
            rest = ("idle/low_demand" if nearly_empty else "healthy" if recovered_empty or ev["usage_p90"] >= hi
                    else None)
            return Label(Mode.MISREAD, None, "a slice of requests breaks the TTFT SLO while the typical one is fast",
                         ev, rest)
        return lab(None, None, "tail over the SLO in too few or too many requests")
    if ev["ttft_p99"] > ttft_slo_s / 2 and ev["ttft_p99"] > 5 * ev["ttft_p50"]:
        return lab(None, None, "tail near the SLO")
    if ev["ttft_slow_n"] >= 1 and ev["ttft_slow_n"] > slice_lo:
        return lab(None, None, "slow slice too close to 1 % of requests: p99 against the SLO is a draw")
    if nearly_empty:
        return lab(Mode.IDLE, IdleCause.LOW_DEMAND, "arrivals far below capacity")
    if recovered_empty:
        return lab(Mode.HEALTHY, None, "recovered from a queue episode earlier in the window")
    if ev["usage_p90"] < hi:
        return lab(None, None, "pool on the border of nearly empty")
    return lab(Mode.HEALTHY, None, "no limit binds")


def combine(labels: list[Label]) -> Label:
    """One label for a target with several data-parallel engines: they must agree."""
    first = labels[0]
    if any((lb.mode, lb.cause) != (first.mode, first.cause) for lb in labels[1:]):
        return Label(None, None, "data-parallel engines disagree", first.evidence)
    if any(lb.without_tail != first.without_tail for lb in labels[1:]):
        return Label(first.mode, first.cause, first.mechanism, first.evidence, None)
    return first


__all__ = ["PRECEDENCE", "Label", "combine", "label_trace"]
