"""Check labels against the simulator's ground truth (1 s resolution, not Prometheus).

A ground-truth oracle applies the signatures of failure-modes.md over the last window
(default 30 min) of each engine trace and picks the first matching mode in precedence
order; a case is valid when the oracle agrees with its expected mode (and idle cause).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from kvwatch.sim.fleet import TargetRun
from kvwatch.sim.trace import Trace
from kvwatch.sim.vocab import PRECEDENCE, IdleCause, Mode

WINDOW_S = 1800.0  # signatures are judged over this window
RECENT_S = 900.0  # pressure must persist into this most recent part (a `for` duration)
TTFT_SLO_S = 2.0


@dataclass(frozen=True)
class WindowStats:
    """Ground-truth statistics of one engine over the window (fractions of steps, s, tokens)."""

    usage_mean: float
    usage_p90: float
    usage_std: float
    frac_high: float  # usage >= 0.90
    excursions: int  # drains (<= 0.3) followed by near-full (>= 0.85)
    frac_waiting: float  # waiting > 0
    waiting_growth: float  # mean waiting, last 5 min minus first 5 min
    preemptions: float
    aborted: float
    running_mean: float
    frac_at_cap: float  # running == max_num_seqs
    frac_nothing_running: float
    generated_tokens: float
    ttft_mean: float
    ttft_p50: float
    ttft_p99: float


def _increase(series: np.ndarray) -> float:
    """Increase of a counter over the window, tolerant to resets to 0."""
    inc = np.diff(series)
    inc[inc < 0] = series[1:][inc < 0]
    return float(inc.sum())


def _excursions(u: np.ndarray, low: float = 0.3, high: float = 0.85) -> int:
    count, drained = 0, False
    for x in u[::5].tolist():
        if x <= low:
            drained = True
        elif x >= high and drained:
            count, drained = count + 1, False
    return count


def window_stats(trace: Trace, window_s: float = WINDOW_S) -> WindowStats:
    sel = trace.t >= trace.t[-1] - window_s
    u = trace.gauge("usage")[sel]
    waiting = trace.gauge("waiting")[sel]
    running = trace.gauge("running")[sel]
    cap = trace.gauge("max_num_seqs")[sel]
    k = max(1, min(len(waiting) // 6, 300))
    t_sel = trace.ttft[trace.ttft_at >= trace.t[-1] - window_s]
    q = np.quantile(t_sel, [0.5, 0.99]) if len(t_sel) else (np.nan, np.nan)
    return WindowStats(
        usage_mean=float(u.mean()), usage_p90=float(np.quantile(u, 0.9)),
        usage_std=float(u.std()), frac_high=float((u >= 0.9).mean()),
        excursions=_excursions(u), frac_waiting=float((waiting > 0).mean()),
        waiting_growth=float(waiting[-k:].mean() - waiting[:k].mean()),
        preemptions=_increase(trace.counter("preemptions")[sel]),
        aborted=_increase(trace.counter("aborted")[sel]),
        running_mean=float(running.mean()), frac_at_cap=float((running >= cap).mean()),
        frac_nothing_running=float((running == 0).mean()),
        generated_tokens=_increase(trace.counter("generation_tokens")[sel]),
        ttft_mean=float(t_sel.mean()) if len(t_sel) else float("nan"),
        ttft_p50=float(q[0]), ttft_p99=float(q[1]),
    )


@dataclass(frozen=True)
class Verdict:
    """The oracle's reading: primary mode (None: no clean signature), idle cause, matches."""

    mode: Mode | None
    cause: IdleCause | None
    matched: tuple[Mode, ...]


def oracle(w: WindowStats, recent: WindowStats, ttft_slo_s: float = TTFT_SLO_S) -> Verdict:
    """Primary mode from the window ``w`` and its most recent part ``recent``.

    Pressure (queue, preemptions) must persist into ``recent``: a burst that ended long ago
    is not a current incident.
    """
    pressure = recent.frac_waiting >= 0.5 or recent.preemptions > 0
    queue = w.frac_waiting >= 0.5 and recent.frac_waiting >= 0.5
    no_queue = w.frac_waiting < 0.2
    tail = (w.ttft_mean <= ttft_slo_s and w.ttft_p99 > ttft_slo_s
            and w.ttft_p99 >= 10 * w.ttft_p50)
    signature = {
        Mode.FULL: w.frac_high >= 0.8 and pressure and w.usage_std < 0.2,
        Mode.OSCILLATING: w.usage_std >= 0.2 and w.excursions >= 2,
        Mode.FRAGMENTED: (w.usage_p90 <= 0.75 and w.usage_std < 0.1
                          and (queue or recent.preemptions > 0) and w.frac_at_cap < 0.5
                          and w.running_mean >= 1 and w.generated_tokens > 0),
        Mode.MISREAD: tail and no_queue and w.preemptions == 0 and w.usage_std < 0.2,
        Mode.IDLE: w.usage_p90 <= 0.15,
        Mode.HEALTHY: (recent.frac_waiting < 0.1 and recent.preemptions == 0
                       and recent.usage_std < 0.2 and w.usage_p90 > 0.15),
    }
    matched = tuple(m for m in PRECEDENCE if signature[m])
    mode = matched[0] if matched else None
    cause = None
    if mode is Mode.IDLE:
        if queue and w.frac_nothing_running >= 0.9 and w.generated_tokens == 0:
            cause = IdleCause.STALLED
        elif queue and w.frac_at_cap >= 0.8:
            cause = IdleCause.BATCH_LIMITED
        elif no_queue and w.ttft_p50 >= ttft_slo_s:
            cause = IdleCause.COMPUTE_BOUND
        elif no_queue:
            cause = IdleCause.LOW_DEMAND
    return Verdict(mode, cause, matched)


@dataclass(frozen=True)
class Validation:
    name: str
    expected: Mode
    cause: IdleCause | None
    verdicts: tuple[Verdict, ...]  # one per engine of the target
    stats: tuple[WindowStats, ...]

    @property
    def ok(self) -> bool:
        return all(v.mode is self.expected and v.cause is self.cause for v in self.verdicts)

    def as_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "observed": [v.mode.value if v.mode else None for v in self.verdicts],
            "observed_cause": [v.cause.value if v.cause else None for v in self.verdicts],
            "stats": [{k: round(x, 4) if isinstance(x, float) else x
                       for k, x in asdict(st).items()} for st in self.stats],
        }


def validate(run: TargetRun, window_s: float = WINDOW_S, recent_s: float = RECENT_S,
             ttft_slo_s: float = TTFT_SLO_S) -> Validation:
    """Does the run show its expected mode's signature over the last ``window_s``?"""
    stats = tuple(window_stats(tr, window_s) for tr in run.traces)
    recent = tuple(window_stats(tr, recent_s) for tr in run.traces)
    verdicts = tuple(oracle(w, r, ttft_slo_s) for w, r in zip(stats, recent, strict=True))
    return Validation(run.spec.name, run.spec.expected, run.spec.cause, verdicts, stats)


def validate_group(members: Sequence[Validation]) -> bool:
    """Imbalance: a saturated (full) member next to healthy ones, fleet mean usage fine."""
    modes = [v.verdicts[0].mode for v in members]
    fleet_mean = float(np.mean([v.stats[0].usage_mean for v in members]))
    return (len(members) >= 3 and modes.count(Mode.FULL) >= 1
            and modes.count(Mode.HEALTHY) >= 2 and fleet_mean <= 0.75
            and all(v.ok for v in members))
