"""Detection time: phase schedules (healthy → a failure mode → healthy) replayed with the backtest.

Every fault of kvwatch.sim.phases (full, oscillating, stalled, low demand, batch-limited,
fragmented) on several dialects and seeds, plus healthy controls, is simulated (ground
truth checked: healthy before, the fault's mechanism at its end, healthy at the end),
backfilled into a real Prometheus with promtool and replayed step by step with
``kvwatch backtest`` (discover → collect → diagnose → alert lifecycle). Per fault mode it
prints the time from the change to kvwatch's incident and to the static
``min_over_time(kv_usage[5m]) > 0.9`` alert measured on the same data, the time to clear
after the load drops and after the ground truth recovers (the backlog drained),
incidents that are not the fault (and, apart, the fault's own incident first named another
mode, then renamed in place), and healthy steps flagged.

    python benchmarks/detection.py [--seeds 1 2] [--dialects vllm-0.10 sglang-0.5 trtllm-serve]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from kvwatch.config import load_settings
from kvwatch.core.models import FailureMode
from kvwatch.core.promclient import PromClient, QueryClient
from kvwatch.core.quality import kv_usage_selectors, static_alert_expr
from kvwatch.core.rules import load_ruleset
from kvwatch.sim.corpus import default_end_time
from kvwatch.sim.fleet import TargetRun
from kvwatch.sim.openmetrics import write_openmetrics
from kvwatch.sim.perturb import Variant, write_variants
from kvwatch.sim.phases import FAULTS, PhasedTarget, draw
from kvwatch.sim.vocab import Dialect
from kvwatch.tools.backtest.models import BacktestResult, IncidentRecord, ModeChange
from kvwatch.tools.backtest.replay import run_backtest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.prom import backfill, prometheus

HEALTHY_S = 2100.0  # lead-in: the replay starts with a full 30-minute window of healthy history
TOTAL_S = 6300.0  # every schedule lasts this long (the after-phase takes the rest)
WARMUP_S = 300.0
STEP_S = 30.0
#: seconds between the simulated scrapes (``--scrape-interval``)
SCRAPE_S = 15.0


@dataclass
class Measured:
    """One schedule's outcome, times in seconds relative to the change / recovery."""

    name: str
    fault: str
    dialect: str
    period_s: float | None
    detect_s: float | None = None
    opened_s: float | None = None  # the incident that came to carry the fault first opened (any mode)
    static_detect_s: float | None = None
    clear_after_drop_s: float | None = None
    clear_after_truth_s: float | None = None
    static_clear_s: float | None = None
    wrong: list[str] = field(default_factory=list)  # incidents that are not the fault
    renamed: list[str] = field(default_factory=list)  # the fault's own incident, first named another mode
    draining: list[str] = field(default_factory=list)  # opened while the backlog drains (load dropped, truth not yet healthy)
    after_recovery: list[str] = field(default_factory=list)  # incidents opened after recovery
    healthy_steps: int = 0
    healthy_flagged: int = 0  # a failure mode named on a healthy step
    healthy_unknown: int = 0  # `unknown` on a healthy step: what decides healthy is not exported (TGI: no TTFT)


def _draw(job: tuple[str | None, int, str, float, float]) -> tuple[PhasedTarget, TargetRun, int]:
    fault, seed, dialect, end_time, scrape_s = job
    # a fixed total: each schedule's change lands at the replay's first step (the after-phase takes the rest)
    return draw(fault, seed, Dialect(dialect), end_time=end_time, healthy_s=HEALTHY_S, total_s=TOTAL_S,
                warmup_s=WARMUP_S, scrape_interval_s=scrape_s)


def _wall(run: TargetRun, sim_t: float) -> float:
    """Simulated time (s since engine start) → Unix seconds of the scrape timeline."""
    return float(run.wall_times[0] + (sim_t - run.sim_times[0]))


def static_alert(client: QueryClient, start: float, end: float) -> dict[tuple[str, str], list[tuple[float, bool]]]:
    """The static alert's firing state per (job, instance) at every step of [start, end]."""
    out: dict[tuple[str, str], dict[float, bool]] = {}
    for sel in kv_usage_selectors():
        q = static_alert_expr(sel)
        for s in client.range(q, datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC), STEP_S):
            key = (s["metric"].get("job", ""), s["metric"].get("instance", ""))
            for t, v in s["values"]:
                out.setdefault(key, {})[float(t)] = float(v) > 0.9
    return {k: sorted(v.items()) for k, v in out.items()}


def _first(seq: Sequence[tuple[float, bool]], after: float, value: bool) -> float | None:
    return next((t for t, v in seq if t >= after and v is value), None)


def _is_fault(mode: str, rule: str, target: PhasedTarget) -> bool:
    if mode != target.mode.value:
        return False
    # the cause is part of the rule id: idle-batch-limited and its fast rule idle-batch-limited-fast
    return target.cause is None or target.cause.value.replace("_", "-") in rule


@dataclass(frozen=True)
class Segment:
    """A span of one incident during which it carried one primary mode (Unix s; end inf = still open)."""

    start: float
    end: float
    mode: str
    rule: str


def segments(inc: IncidentRecord) -> list[Segment]:
    """An incident cut at every change of its primary mode: one incident per engine episode
    becomes `full` in place when a fragmented stall's backlog drains through a full pool, so
    the mode it opened with would be lost if only its last mode were read."""
    end = math.inf if inc.resolved_at is None else inc.resolved_at
    changes = inc.modes or (ModeChange(inc.opened_at, inc.mode, inc.rule),)
    bounds = [c.at for c in changes[1:]] + [end]
    return [Segment(c.at, b, c.mode.value, c.rule) for c, b in zip(changes, bounds, strict=True)]


def measure(result: BacktestResult, runs: dict[str, tuple[PhasedTarget, TargetRun]],
            static: dict[tuple[str, str], list[tuple[float, bool]]], grace_s: float = 600.0) -> list[Measured]:
    out = []
    for tl in result.timelines:
        inst = tl.target.key.instance
        target, run = runs[inst]
        m = Measured(inst, target.fault, target.spec.dialect.value, target.period_s)
        fault_at = _wall(run, target.fault_at) if math.isfinite(target.fault_at) else math.inf
        drop_at = _wall(run, target.recover_at) if math.isfinite(target.recover_at) else math.inf
        truth_at = _wall(run, target.recovered_at) if math.isfinite(target.recovered_at) else math.inf
        per_inc = [segments(inc) for inc in tl.incidents]
        segs = [s for ss in per_inc for s in ss]
        mine = [s for s in segs if _is_fault(s.mode, s.rule, target) and s.start >= fault_at]
        # an incident that comes to carry the fault was the fault's page from its start: a mode it
        # carried before (the first peak of an oscillation pinned like full) named the fault late
        # (detect counts to the fault's own name), it is not an incident that is not the fault
        renamed = {s for ss in per_inc if any(x in mine for x in ss)
                   for s in ss if s not in mine and s.start < min(x.start for x in ss if x in mine)}
        if mine:
            first = min(mine, key=lambda s: s.start)
            m.detect_s = first.start - fault_at
            m.opened_s = min(s.start for ss in per_inc if any(x in mine for x in ss) for s in ss) - fault_at
            last = max(s.end for s in mine)
            if math.isfinite(last):
                m.clear_after_drop_s = last - drop_at
                m.clear_after_truth_s = last - truth_at
        if not mine and target.fault == "low_demand":
            # idle-low-demand is an info diagnosis (no incident): read the state timeline
            hits = [t for t, st in zip(tl.times, tl.states, strict=True)
                    if fault_at <= t and st.value == target.mode.value]
            if hits:
                m.detect_s = hits[0] - fault_at
                back = [t for t, st in zip(tl.times, tl.states, strict=True)
                        if t > hits[-1] and st.value != target.mode.value]
                if back:
                    m.clear_after_drop_s = back[0] - drop_at
                    m.clear_after_truth_s = back[0] - truth_at
        for seg in segs:
            if seg in mine:
                continue
            what = f"{seg.rule}@{(seg.start - fault_at) / 60:+.1f}m" if math.isfinite(fault_at) else seg.rule
            if seg in renamed:
                m.renamed.append(what)
            elif seg.start >= truth_at:
                m.after_recovery.append(what)
            elif seg.start >= drop_at:
                m.draining.append(what)
            else:
                m.wrong.append(what)
        for t, s in zip(tl.times, tl.states, strict=True):
            if t < fault_at or t >= truth_at + grace_s:
                m.healthy_steps += 1
                m.healthy_flagged += s not in (FailureMode.HEALTHY, FailureMode.UNKNOWN)
                m.healthy_unknown += s is FailureMode.UNKNOWN
        st = static.get((tl.target.key.job, inst), [])
        if math.isfinite(fault_at):
            fired = _first(st, fault_at, True)
            if fired is not None and fired < drop_at + 1800:
                m.static_detect_s = fired - fault_at
                cleared = _first(st, max(fired, drop_at), False)
                m.static_clear_s = None if cleared is None else cleared - drop_at
        out.append(m)
    return out


def _fmt(xs: list[float | None]) -> str:
    got = [x for x in xs if x is not None]
    if not got:
        return "-"
    return f"{statistics.median(got) / 60:.1f} / {max(got) / 60:.1f}"


def report(ms: list[Measured]) -> str:
    lines = [f"{'fault':<14} {'n':>2} {'detected':>8} {'detect med/max min':>18} {'static med/max':>14}"
             f" {'before static':>13} {'clear after drop':>16} {'clear after truth':>17} {'static clear':>12}"
             f" {'wrong':>5} {'renamed':>7} {'draining':>8} {'after rec.':>10} {'healthy: flagged/unknown/steps':>30}"]
    for fault in [*FAULTS, "control"]:
        g = [m for m in ms if m.fault == fault]
        if not g:
            continue
        before = sum(1 for m in g if m.detect_s is not None and (m.static_detect_s is None or m.detect_s < m.static_detect_s))
        lines.append(
            f"{fault:<14} {len(g):>2} {sum(m.detect_s is not None for m in g):>8} {_fmt([m.detect_s for m in g]):>18}"
            f" {_fmt([m.static_detect_s for m in g]):>14} {before:>13} {_fmt([m.clear_after_drop_s for m in g]):>16}"
            f" {_fmt([m.clear_after_truth_s for m in g]):>17} {_fmt([m.static_clear_s for m in g]):>12}"
            f" {sum(len(m.wrong) for m in g):>5} {sum(len(m.renamed) for m in g):>7} {sum(len(m.draining) for m in g):>8}"
            f" {sum(len(m.after_recovery) for m in g):>10}"
            f" {sum(m.healthy_flagged for m in g):>14}/{sum(m.healthy_unknown for m in g)}/{sum(m.healthy_steps for m in g)}")
    lines.append("(low_demand is an info diagnosis, no incident: detection and clearing read from the state timeline)")
    osc = [m for m in ms if m.fault == "oscillating" and m.detect_s is not None and m.period_s]
    if osc:
        lines.append("oscillation detected after " + ", ".join(f"{m.detect_s / m.period_s:.1f}" for m in osc)
                     + " periods")
        early = [m for m in osc if m.renamed and m.opened_s is not None]
        if early:
            lines.append(f"  {len(early)} of them first opened as another mode (renamed in place) after "
                         + ", ".join(f"{m.opened_s / m.period_s:.1f}" for m in early if m.period_s) + " periods")
    clears = [m.clear_after_truth_s for m in ms if m.clear_after_truth_s is not None]
    if clears:
        lines.append(f"median clear after ground-truth recovery, all faults: {statistics.median(clears) / 60:.1f} min")
    lines.append("")
    for m in ms:
        if m.wrong or m.renamed or m.draining or m.after_recovery or (m.detect_s is None and m.fault != "control") \
                or m.healthy_flagged or m.healthy_unknown:
            lines.append(f"  {m.name:<42} detect {m.detect_s} opened {m.opened_s} wrong {m.wrong}"
                         f" renamed {m.renamed} draining {m.draining}"
                         f" after-recovery {m.after_recovery} healthy flagged {m.healthy_flagged}"
                         f" unknown {m.healthy_unknown}")
    return "\n".join(lines)


def run(work: Path, seeds: list[int], dialects: list[str], controls: int, faults: Sequence[str] = tuple(FAULTS),
        scrape_s: float = SCRAPE_S, phase: bool = False) -> tuple[list[Measured], dict[str, float]]:
    end_time = default_end_time()
    jobs: list[tuple[str | None, int, str, float, float]] = []
    for s in seeds:
        for i, f in enumerate(FAULTS):
            if f not in faults:
                continue
            jobs.append((f, s, dialects[(i + s) % len(dialects)], end_time, scrape_s))
    jobs += [(None, 100 + k, dialects[k % len(dialects)], end_time, scrape_s) for k in range(controls)]
    t0 = time.monotonic()
    with ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        drawn = list(pool.map(_draw, jobs))
    runs = {r.spec.instance(): (p, r) for p, r, _ in drawn}
    if phase:  # each target at its own offset into the interval, jittered (kvwatch.sim.perturb)
        write_variants([r for _, r, _ in drawn], [Variant("phase", phase=True)], work / "fleet.om", job="phases")
    else:
        write_openmetrics([r for _, r, _ in drawn], work / "fleet.om", job="phases")
    (work / "schedules.json").write_text(json.dumps({r.spec.instance(): {
        "fault": p.fault, "fault_at": _wall(r, p.fault_at) if math.isfinite(p.fault_at) else None,
        "recover_at": _wall(r, p.recover_at) if math.isfinite(p.recover_at) else None,
        "recovered_at": _wall(r, p.recovered_at) if math.isfinite(p.recovered_at) else None}
        for p, r, _ in drawn}, indent=1))
    t1 = time.monotonic()
    backfill(work / "fleet.om", work / "tsdb")
    (work / "fleet.om").unlink()
    t2 = time.monotonic()
    start = end_time - (TOTAL_S - WARMUP_S) + 1800  # a full window of history before the first step
    with prometheus(work / "tsdb") as url:
        client = PromClient(url, timeout_s=300)
        settings = load_settings(None, environ={})
        result = run_backtest(client, settings, load_ruleset(), datetime.fromtimestamp(start, UTC),
                              datetime.fromtimestamp(end_time, UTC), STEP_S)
        t3 = time.monotonic()
        static = static_alert(client, start, end_time)
    timing = {"simulate": t1 - t0, "backfill": t2 - t1, "backtest": t3 - t2,
              "redrawn": float(sum(k for _, _, k in drawn))}
    return measure(result, runs, static), timing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--dialects", nargs="+", default=["vllm-0.10", "sglang-0.5", "trtllm-serve", "vllm-0.33"])
    ap.add_argument("--controls", type=int, default=3, help="healthy-throughout targets")
    ap.add_argument("--faults", nargs="+", default=list(FAULTS), choices=list(FAULTS))
    ap.add_argument("--json", metavar="FILE", help="also write the per-schedule measurements")
    ap.add_argument("--keep", metavar="DIR", help="keep the TSDB here (default: a temp dir, removed)")
    ap.add_argument("--scrape-interval", type=float, default=SCRAPE_S, metavar="S",
                    help="seconds between the simulated scrapes (rate windows widen to 4 of them)")
    ap.add_argument("--phase", action="store_true",
                    help="scrape each target at its own phase with ±10 %% jitter, as Prometheus does")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvwatch-detect-") as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        ms, timing = run(work, args.seeds, args.dialects, args.controls, args.faults, args.scrape_interval,
                         args.phase)
    print(f"{len(ms)} schedules, scraped every {args.scrape_interval:g}s{' at per-target phases' if args.phase else ''};"
          f" simulate {timing['simulate']:.0f}s (redrawn {timing['redrawn']:.0f}),"
          f" backfill {timing['backfill']:.0f}s, backtest {timing['backtest']:.0f}s at {STEP_S:.0f}s steps")
    print(report(ms))
    if args.json:
        Path(args.json).write_text(json.dumps([m.__dict__ for m in ms], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
