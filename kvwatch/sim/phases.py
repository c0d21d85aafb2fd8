"""Phase schedules for detection-time measurements: healthy → one failure mode → healthy.

Each :class:`PhasedTarget` runs one engine (fixed pool geometry) through three phases:
steady healthy traffic, a fault (more demand than the pool holds, periodic fill-and-drain,
a wedged scheduler, traffic gone, a small ``max_num_seqs``, reserve-for-max-output
admission, a slow engine, a long-prompt slice), and healthy traffic again (a wedged
scheduler recovers by a restart). Parameters are drawn per seed from the same wide ranges
as :mod:`kvwatch.sim.randomized`; :func:`check` confirms from the ground truth that the
fault phase shows its mechanism (and the phases around it do not).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from kvwatch.sim.calibrate import reserved_concurrency, throughput
from kvwatch.sim.engine import EngineConfig
from kvwatch.sim.fleet import TargetRun, TargetSpec, seed_of, simulate
from kvwatch.sim.mechanism import Label, label_trace
from kvwatch.sim.randomized import _cap_rate, _logu, draw_engine, draw_workload
from kvwatch.sim.scenarios import Replica, Segment
from kvwatch.sim.trace import Trace
from kvwatch.sim.vocab import Dialect, IdleCause, Mode
from kvwatch.sim.workload import LogNormal, Periodic, Steady, Workload


@dataclass(frozen=True)
class Fault:
    """The fault phase: the configuration and workload it switches to, and how long it lasts."""

    mode: Mode
    cause: IdleCause | None
    config: EngineConfig
    workload: Workload
    duration_s: float
    period_s: float | None = None  # oscillation period
    restart_after: bool = False  # recovery is a process restart (wedged scheduler)


FaultFn = Callable[[np.random.Generator, EngineConfig, Workload, float], Fault]


def _full(rng: np.random.Generator, cfg: EngineConfig, wl: Workload, cap: float) -> Fault:
    return Fault(Mode.FULL, None, cfg, replace(wl, rate=Steady(rng.uniform(1.5, 2.5) * cap)), 1200)


def _oscillating(rng: np.random.Generator, cfg: EngineConfig, wl: Workload, cap: float) -> Fault:
    period = float(rng.uniform(180, 420))
    shape = Periodic(low=0.02 * cap, high=rng.uniform(1.4, 2.2) * cap, period_s=period, duty=0.4)
    return Fault(Mode.OSCILLATING, None, cfg, replace(wl, rate=shape), max(1500, 5 * period), period)


def _stalled(rng: np.random.Generator, cfg: EngineConfig, wl: Workload, cap: float) -> Fault:
    return Fault(Mode.IDLE, IdleCause.STALLED, replace(cfg, stalled=True), wl, 900, restart_after=True)


def _low_demand(rng: np.random.Generator, cfg: EngineConfig, wl: Workload, cap: float) -> Fault:
    return Fault(Mode.IDLE, IdleCause.LOW_DEMAND, cfg, replace(wl, rate=Steady(rng.uniform(0.005, 0.04) * cap)),
                 2700)


def _batch_limited(rng: np.random.Generator, cfg: EngineConfig, wl: Workload, cap: float) -> Fault:
    small = replace(cfg, max_num_seqs=int(rng.choice([4, 8, 16])))
    lam = throughput(small, wl, small.max_num_seqs) * rng.uniform(1.5, 2.5)
    return Fault(Mode.IDLE, IdleCause.BATCH_LIMITED, small, replace(wl, rate=Steady(lam)), 1200)


def _fragmented(rng: np.random.Generator, cfg: EngineConfig, wl: Workload, cap: float) -> Fault:
    res = replace(cfg, reserve_max_output=True)
    wl = replace(wl, max_tokens=int(rng.choice([2048, 4096])))
    lam = throughput(res, wl, reserved_concurrency(res, wl)) * rng.uniform(1.5, 2.2)
    return Fault(Mode.FRAGMENTED, None, res, replace(wl, rate=Steady(lam)), 1200)


FAULTS: dict[str, FaultFn] = {
    "full": _full, "oscillating": _oscillating, "stalled": _stalled, "low_demand": _low_demand,
    "batch_limited": _batch_limited, "fragmented": _fragmented,
}


@dataclass(frozen=True)
class PhasedTarget:
    """One engine's schedule; times are seconds since the start of the run (incl. warm-up)."""

    spec: TargetSpec
    fault: str
    mode: Mode
    cause: IdleCause | None
    fault_at: float
    recover_at: float
    period_s: float | None
    recovered_at: float = math.inf  # ground truth: the queue empties for good after the fault


def build(fault: str | None, seed: int, dialect: Dialect, *, healthy_s: float = 1200.0,
          after_s: float = 1500.0, warmup_s: float = 300.0) -> PhasedTarget:
    """Healthy for ``healthy_s``, the fault, healthy for ``after_s`` (``fault`` None: healthy
    throughout, a control)."""
    rng = np.random.default_rng(seed_of(seed, fault or "control", "phases"))
    base = draw_engine(rng, dialect.engine)
    kv = _logu(rng, 150_000, 800_000)
    cfg = replace(base, watermark_frac=0.0, max_num_seqs=1024, num_blocks=int(kv // base.block_size),
                  max_model_len=min(base.max_model_len, 16384))
    wl = draw_workload(rng, cfg, bimodal=0.0)
    wl = replace(wl, prompt=LogNormal(_logu(rng, 200, 1500), _logu(rng, 2000, 6000)))
    cap = _cap_rate(cfg, wl)
    cfg = replace(cfg, client_timeout_s=float(rng.uniform(120, 300)))
    healthy = replace(wl, rate=Steady(rng.uniform(0.45, 0.75) * cap))
    start = warmup_s + healthy_s
    if fault is None:
        segs = (Segment(0.0, cfg, healthy),)
        spec = TargetSpec(f"ph-control-{seed}-{dialect.value}", "control", dialect, seed,
                          Replica(segs, Mode.HEALTHY), f"kvwatch-phase/control-{seed}")
        return PhasedTarget(spec, "control", Mode.HEALTHY, None, math.inf, math.inf, None)
    f = FAULTS[fault](rng, cfg, wl, cap)
    end = start + f.duration_s
    segs = (Segment(0.0, cfg, healthy), Segment(start, f.config, f.workload), Segment(end, cfg, healthy))
    spec = TargetSpec(f"ph-{fault}-{seed}-{dialect.value}", fault, dialect, seed, Replica(segs, f.mode, f.cause),
                      f"kvwatch-phase/{fault}-{seed}", restart_at_s=end if f.restart_after else None)
    return PhasedTarget(spec, fault, f.mode, f.cause, start, end, f.period_s)


def run(target: PhasedTarget, *, healthy_s: float = 1200.0, after_s: float = 1500.0, warmup_s: float = 300.0,
        end_time: float, scrape_interval_s: float = 15.0) -> TargetRun:
    """Simulate the whole schedule; the last scrape is stamped ``end_time`` (epoch s)."""
    fault_s = 0.0 if math.isinf(target.recover_at) else target.recover_at - target.fault_at
    duration = healthy_s + fault_s + after_s
    return simulate(target.spec, duration_s=duration, end_time=end_time, warmup_s=warmup_s,
                    scrape_interval_s=scrape_interval_s)


def _until(trace: Trace, t: float) -> Trace:
    """The trace up to simulated time ``t`` (histogram snapshots dropped: labels do not use them)."""
    sel = trace.t < t
    keep = trace.ttft_at < t
    return replace(trace, t=trace.t[sel], gauges=trace.gauges[sel], counters=trace.counters[sel],
                   ttft_at=trace.ttft_at[keep], ttft=trace.ttft[keep])


def check(target: PhasedTarget, run_: TargetRun) -> tuple[Label, Label, Label]:
    """Ground-truth labels at the end of the healthy lead-in, of the fault and of the run."""
    tr = run_.traces[0]
    before = label_trace(_until(tr, min(target.fault_at, tr.t[-1])))
    during = label_trace(_until(tr, target.recover_at)) if not math.isinf(target.recover_at) else before
    return before, during, label_trace(tr)


def recovered_at(target: PhasedTarget, run_: TargetRun, quiet_s: float = 60.0) -> float:
    """First simulated instant after the fault from which no request waits and nothing is
    preempted for ``quiet_s`` (a backlog drains after the load drops)."""
    if math.isinf(target.recover_at):
        return math.inf
    tr = run_.traces[0]
    pre = np.diff(tr.counter("preemptions"), prepend=tr.counter("preemptions")[0]) > 0
    busy = (tr.gauge("waiting") > 0) | pre
    after = np.nonzero(tr.t >= target.recover_at)[0]
    k = int(quiet_s)
    for i in after:
        if not busy[i:i + k].any():
            return float(tr.t[i])
    return math.inf


def valid(target: PhasedTarget, labels: tuple[Label, Label, Label]) -> bool:
    """Healthy before and at the end, the fault's mechanism at the end of the fault."""
    before, during, after = labels
    return (before.mode is Mode.HEALTHY and after.mode is Mode.HEALTHY
            and (during.mode, during.cause) == (target.mode, target.cause))


def draw(fault: str | None, seed: int, dialect: Dialect, *, end_time: float, attempts: int = 12,
         total_s: float | None = None, scrape_interval_s: float = 15.0,
         **kw: float) -> tuple[PhasedTarget, TargetRun, int]:
    """A schedule whose ground truth shows what it should (redrawn up to ``attempts`` times);
    returns it, its run and the number of redraws.

    ``total_s`` (s, warm-up excluded) fixes the run's length: the after-phase takes what the
    drawn fault leaves, so every schedule's change lands at the same instant before
    ``end_time`` (an oscillation lasts 5 periods, so its length varies with the draw)."""
    for k in range(attempts):
        target = build(fault, seed * 100 + k, dialect, **kw)
        if total_s is not None:
            fault_s = 0.0 if math.isinf(target.recover_at) else target.recover_at - target.fault_at
            kw = {**kw, "after_s": total_s - kw.get("healthy_s", 1200.0) - fault_s}
        run_ = run(target, end_time=end_time, scrape_interval_s=scrape_interval_s, **kw)
        if valid(target, check(target, run_)):
            return replace(target, recovered_at=recovered_at(target, run_)), run_, k
    raise RuntimeError(f"{fault} seed {seed} on {dialect}: no valid schedule in {attempts} draws")
