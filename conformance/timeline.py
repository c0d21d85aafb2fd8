"""A simulator run as a per-scrape timeline that an engine's own exporter can replay.

Runs in kvwatch's environment (it imports ``kvwatch.sim``); the drivers that read its JSON
run inside the engine venvs and import nothing of kvwatch. One timeline holds, per scrape
instant and per data-parallel engine: the gauges after the last step before the scrape,
the counter increments since the previous scrape, and the histogram observations made in
between as ``[value, count]`` pairs.

Observations are rebuilt from the simulator's binned histograms: every observation keeps
its bucket of the union bounds (which contain every engine's bounds, so each engine's
cumulative ``le`` counts are exact), and one position inside the buckets per interval is
chosen so that the interval's sum matches. Fractional counts (weighted inter-token
observations) are rounded on the cumulative count, so the exported totals never drift.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

import numpy as np

from kvwatch.sim.buckets import QUANTITIES, select
from kvwatch.sim.fleet import TargetRun, make_targets, simulate
from kvwatch.sim.trace import COUNTERS, GAUGES, Trace

SCHEMA = "kvwatch.conformance/timeline-v1"
#: counters whose per-interval increments a driver needs
DELTAS = ("preemptions", "prompt_tokens", "generation_tokens", "prefix_queries", "prefix_hits",
          "success_stop", "success_length", "aborted")
#: gauges a driver needs (usage is the fraction 0-1 of KV blocks holding KV)
STATE = ("usage", "used_blocks", "running", "waiting", "paused", "prefilling", "decoding",
         "prompt_tps", "gen_tps")


def _positions(counts: np.ndarray, lo: np.ndarray, width: np.ndarray, total: float
               ) -> np.ndarray:
    """One fraction of the way into each bucket (0 < f <= 1) so that the values sum to
    ``total``; clamped when the binned sum cannot be met exactly."""
    base = float(np.dot(counts, lo))
    span = float(np.dot(counts, width))
    f = (total - base) / span if span > 0 else 1.0
    return lo + min(max(f, 1e-6), 1.0) * width


def _observations(trace: Trace, name: str) -> list[list[list[float]]]:
    """Per scrape: ``[[value, count], ...]`` observed since the previous scrape."""
    bounds = trace.bank.bounds[name]
    cum, _, sums = select(trace.bank, name, trace.hist, bounds)
    # cumulative per-bucket counts (le) → per-bucket counts, rounded on the running total
    le = np.stack(cum, axis=-1)  # (m, len(bounds)+1)
    per_bucket = np.diff(np.concatenate([np.zeros((le.shape[0], 1)), le], axis=1), axis=1)
    rounded = np.floor(per_bucket + 0.5)  # snapshots are cumulative in time already
    counts = np.diff(np.concatenate([np.zeros((1, rounded.shape[1])), rounded]), axis=0)
    sum_delta = np.diff(np.concatenate([[0.0], sums]))
    edges = np.asarray(bounds, dtype=float)
    lo = np.concatenate([[0.0], edges])
    hi = np.concatenate([edges, [edges[-1] * 2.0]])  # +Inf bucket: up to twice the last bound
    width = hi - lo
    out: list[list[list[float]]] = []
    for i in range(counts.shape[0]):
        k = counts[i]
        nz = k > 0
        if not nz.any():
            out.append([])
            continue
        vals = _positions(k[nz], lo[nz], width[nz], float(sum_delta[i]))
        out.append([[float(v), int(n)] for v, n in zip(vals, k[nz], strict=True)])
    return out


def engine_timeline(trace: Trace, wall_times: np.ndarray) -> list[dict[str, Any]]:
    """The scrape-by-scrape timeline of one engine."""
    idx = trace.hist_idx
    gauges = trace.gauges[idx]
    counters = trace.counters[idx]
    prev = np.vstack([np.zeros((1, counters.shape[1])), counters[:-1]])
    inc = counters - prev
    obs = {q: _observations(trace, q) for q in QUANTITIES}
    steps = []
    for i, t in enumerate(wall_times.tolist()):
        steps.append({
            "t": round(float(t), 3),
            "state": {n: float(gauges[i, GAUGES.index(n)]) for n in STATE},
            "delta": {n: float(inc[i, COUNTERS.index(n)]) for n in DELTAS},
            "obs": {q: obs[q][i] for q in QUANTITIES},
        })
    return steps


def timeline(run: TargetRun, interval_s: float) -> dict[str, Any]:
    """The JSON document a driver replays: the target's identity, config and engines."""
    spec = run.spec
    cfg = spec.config
    return {
        "schema": SCHEMA,
        "target": {"name": spec.name, "preset": spec.preset, "sim_dialect": spec.dialect.value,
                   "seed": spec.seed, "expected": spec.expected.value,
                   "model_name": spec.model_name},
        "config": asdict(cfg),
        "scrape_interval_s": interval_s,
        "engines": [engine_timeline(tr, run.wall_times) for tr in run.traces],
    }


def simulate_timeline(preset: str, sim_dialect: str, seed: int, *, duration_s: float,
                      end_time: float, warmup_s: float = 300.0, interval_s: float = 15.0,
                      data_parallel: int = 1) -> tuple[TargetRun, dict[str, Any]]:
    """Simulate one single-replica preset and return the run and its timeline."""
    (spec, *rest) = make_targets(preset, sim_dialect, seed, run_s=warmup_s + duration_s,
                                 data_parallel=data_parallel)
    if rest:
        raise ValueError(f"preset {preset!r} has several replicas; pick a single-replica one")
    run = simulate(spec, duration_s=duration_s, end_time=end_time, warmup_s=warmup_s,
                   scrape_interval_s=interval_s)
    return run, timeline(run, interval_s)


def check_finite(doc: dict[str, Any]) -> None:
    """Raise ValueError naming the first non-finite number (JSON cannot carry it)."""
    for e, steps in enumerate(doc["engines"]):
        for i, step in enumerate(steps):
            for part in ("state", "delta"):
                for k, v in step[part].items():
                    if not math.isfinite(v):
                        raise ValueError(f"engine {e} step {i}: {part}.{k} = {v}")
