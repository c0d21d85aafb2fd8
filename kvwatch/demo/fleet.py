"""Simulate the demo fleet and turn its ground truth into :class:`FleetData`.

One engine per preset replica (every failure mode and idle sub-cause), engine
families rotated so several dialects show up. Each engine runs ``warmup + window``
simulated seconds; histograms are snapshotted on the evaluation grid.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvwatch.collect import resolve
from kvwatch.demo.groundtruth import histogram_mean, histogram_quantile, rate
from kvwatch.dialects import DIALECT_BY_ID
from kvwatch.fleetdata import FleetData
from kvwatch.models import Target, TargetKey
from kvwatch.signals import Signal
from kvwatch.sim.buckets import UNION
from kvwatch.sim.engine import Engine
from kvwatch.sim.scenarios import PRESETS, BuildContext, Replica, sample_base
from kvwatch.sim.trace import Recorder, Trace

#: engine family → the kvwatch dialect its in-process target speaks (all its signals sourced)
FAMILY_DIALECT = {"vllm": "vllm-v1", "sglang": "sglang", "trtllm": "trtllm-serve"}
FAMILIES = ("vllm", "sglang", "trtllm")
#: presets a demo runs (the multi-replica imbalance preset counts as one)
DEMO_PRESETS: tuple[str, ...] = tuple(PRESETS)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SimTarget:
    """One simulated engine: identity, expected mode, and its ground truth."""

    key: TargetKey
    preset: str
    family: str
    expected: str
    trace: Trace


def _run(replica: Replica, seed: int, seconds: float, step_s: float) -> Trace:
    first = replica.segments[0]
    rec = Recorder()
    eng = Engine(first.config, first.workload, seed=seed, recorder=rec)
    nxt = 1
    every = max(1, round(step_s / first.config.dt))
    n = int(seconds / first.config.dt)
    for i in range(n):
        while nxt < len(replica.segments) and eng.t >= replica.segments[nxt].start_s:
            seg = replica.segments[nxt]
            eng.reconfigure(seg.config, seg.workload)
            nxt += 1
        eng.step()
        if (n - 1 - i) % every == 0:
            rec.snapshot_hist(eng.hist)
    return rec.trace(eng.cfg, eng.hist)


def simulate(seed: int, seconds: float, step_s: float, progress: Progress = lambda _: None,
             presets: tuple[str, ...] = DEMO_PRESETS) -> list[SimTarget]:
    """Run every preset (each replica one engine) for ``seconds``; deterministic per seed."""
    out: list[SimTarget] = []
    for i, name in enumerate(presets):
        family = FAMILIES[i % len(FAMILIES)]
        rng = np.random.default_rng([seed, i])
        replicas = PRESETS[name].build(BuildContext(sample_base(rng, family), rng, seconds))
        progress(f"[{i + 1}/{len(presets)}] simulating {name} ({family}, {len(replicas)} engine(s))")
        for j, rep in enumerate(replicas):
            trace = _run(rep, seed * 1000 + i * 10 + j, seconds, step_s)
            label = rep.expected.value + (f" ({rep.cause.value})" if rep.cause else "")
            inst = f"{name}-{j}" if len(replicas) > 1 else name
            out.append(SimTarget(TargetKey(f"demo-{family}", inst), name, family, label, trace))
    return out


def _signals(tr: Trace, grid_rel: np.ndarray, rate_window: float) -> dict[Signal, np.ndarray]:
    idx = tr.hist_idx
    t = tr.t[idx] + tr.config.dt  # state after the step
    t = t - t[-1] + grid_rel[-1]
    g, c = tr.gauge, tr.counter

    def at(v: np.ndarray) -> np.ndarray:
        return np.asarray(v)[idx]

    def hist(name: str) -> tuple[tuple[float, ...], np.ndarray, np.ndarray, np.ndarray]:
        bounds = UNION[name]
        cum, count, total = tr.view(t).hist(name, bounds)
        return bounds, np.column_stack(cum), np.asarray(count), np.asarray(total)

    out: dict[Signal, np.ndarray] = {
        Signal.KV_USAGE: at(g("usage")),
        Signal.RUNNING: at(g("running")),
        Signal.WAITING: at(g("waiting")),
        Signal.PREEMPTIONS: rate(at(c("preemptions")), t, rate_window),
        Signal.GEN_TPS: rate(at(c("generation_tokens")), t, rate_window),
        Signal.PROMPT_TPS: rate(at(c("prompt_tokens")), t, rate_window),
        Signal.REQUEST_RATE: rate(at(c("success_stop")) + at(c("success_length")), t, rate_window),
        Signal.ABORT_RATE: rate(at(c("aborted")), t, rate_window),
        Signal.KV_CAPACITY_TOKENS: np.full(len(t), float(tr.config.kv_tokens)),
        Signal.MAX_RUNNING: at(g("max_num_seqs")),
    }
    b, cum, count, total = hist("ttft")
    out[Signal.TTFT_P50] = histogram_quantile(0.5, b, cum, t, rate_window)
    out[Signal.TTFT_P99] = histogram_quantile(0.99, b, cum, t, rate_window)
    out[Signal.TTFT_MEAN] = histogram_mean(total, count, t, rate_window)
    b, cum, count, total = hist("queue")
    out[Signal.QUEUE_P99] = histogram_quantile(0.99, b, cum, t, rate_window)
    out[Signal.QUEUE_MEAN] = histogram_mean(total, count, t, rate_window)
    b, cum, _, _ = hist("itl")
    out[Signal.ITL_P99] = histogram_quantile(0.99, b, cum, t, rate_window)
    return out


def fleet_data(sims: list[SimTarget], at: float, window_s: float, step_s: float,
               rate_window: float) -> tuple[list[Target], FleetData]:
    """Targets and their signals on kvwatch's evaluation grid ending at ``at`` (Unix s)."""
    n = int(window_s // step_s)
    grid = at - step_s * np.arange(n, -1, -1, dtype=float)
    targets: list[Target] = []
    data = FleetData(grid=grid, targets={})
    for s in sims:
        dialect = DIALECT_BY_ID[FAMILY_DIALECT[s.family]]
        target = Target(s.key, dialect.id, dialect.engine, s.preset, frozenset(dialect.names()))
        targets.append(target)
        data.targets[s.key] = target
        sourced = set(resolve(target))
        data.sourced[s.key] = sourced
        sig = _signals(s.trace, grid, rate_window)
        for name, values in sig.items():
            if name in sourced:
                data.put(s.key, name, values[-len(grid):])
    return targets, data
