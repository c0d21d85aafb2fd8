"""CPU cost of the pure diagnosis core per target, on in-memory data (no Prometheus).

Builds a fleet of N targets whose signals reproduce every failure-mode signature
(30-minute window, 30 s step: 61 samples per signal), then times
``kvwatch.core.diagnose.diagnose`` with ``time.process_time`` over several repeats.

    python benchmarks/diagnose_cost.py [--targets 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kvwatch.core.diagnose import Params, diagnose
from kvwatch.core.frame import FleetData
from kvwatch.core.models import Target, TargetKey
from kvwatch.core.rules import load_ruleset
from kvwatch.core.signals import Signal

STEP, WINDOW = 30.0, 1800.0
N = int(WINDOW // STEP) + 1
GRID = 1_700_000_000.0 + STEP * np.arange(N)


def _signals(kind: int, rng: np.random.Generator) -> dict[Signal, np.ndarray]:
    t = GRID - GRID[0]
    noise = rng.normal(0, 0.02, N)
    base = {
        Signal.KV_USAGE: np.clip(0.75 + noise, 0, 1),
        Signal.RUNNING: 40 + rng.integers(-5, 5, N).astype(float),
        Signal.WAITING: np.zeros(N),
        Signal.PREEMPTIONS: np.zeros(N),
        Signal.TTFT_P50: np.full(N, 0.2),
        Signal.TTFT_P99: np.full(N, 0.8),
        Signal.TTFT_MEAN: np.full(N, 0.3),
        Signal.QUEUE_P99: np.full(N, 0.3),
        Signal.ITL_P99: np.full(N, 0.05),
        Signal.GEN_TPS: np.full(N, 2000.0),
        Signal.PROMPT_TPS: np.full(N, 6000.0),
        Signal.REQUEST_RATE: np.full(N, 4.0),
        Signal.ABORT_RATE: np.zeros(N),
        Signal.KV_CAPACITY_TOKENS: np.full(N, 200_000.0),
    }
    variants = [
        {},  # healthy
        {Signal.KV_USAGE: np.clip(0.97 + noise / 4, 0, 1), Signal.WAITING: np.linspace(2, 30, N)},
        {Signal.KV_USAGE: 0.55 + 0.44 * np.sin(2 * np.pi * t / 300)},
        {Signal.KV_USAGE: np.full(N, 0.5) + noise, Signal.WAITING: np.full(N, 6.0)},
        {Signal.TTFT_P99: np.full(N, 4.0)},
        {Signal.KV_USAGE: np.full(N, 0.05), Signal.RUNNING: np.full(N, 2.0)},
    ]
    base.update(variants[kind % len(variants)])
    return base


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    targets = [Target(TargetKey("bench", f"t{i}:8000"), "vllm-v1", "vllm", f"m{i % 100}") for i in range(args.targets)]
    data = FleetData(grid=GRID, targets={t.key: t for t in targets})
    for i, t in enumerate(targets):
        sigs = _signals(i, rng)
        data.sourced[t.key] = set(sigs)
        for s, v in sigs.items():
            data.put(t.key, s, v)
    rules = load_ruleset()
    params = Params(at=float(GRID[-1]), window_s=WINDOW, step_s=STEP)
    diagnose(targets, data, rules, params)  # warm-up: imports, scipy
    costs = []
    for _ in range(args.repeats):
        c0 = time.process_time()
        results = diagnose(targets, data, rules, params)
        costs.append((time.process_time() - c0) / len(targets) * 1000)
    states: dict[str, int] = {}
    for r in results:
        states[r.state.value] = states.get(r.state.value, 0) + 1
    print(f"targets: {args.targets}, rules: {len(rules.rules)}, samples per signal: {N}")
    print(f"states: {states}")
    print(f"diagnosis CPU per target: best {min(costs):.3f} ms, median {sorted(costs)[len(costs) // 2]:.3f} ms"
          f" ({args.repeats} repeats)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
