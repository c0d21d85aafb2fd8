"""The fleet-wide rule evaluator gives exactly the per-target evaluator's results.

``diagnose`` evaluates rule conditions for the whole fleet at once
(:mod:`kvwatch.core.diagnose.fleetrules`); ``diagnose(..., reference=True)`` walks each
target's rules one by one (:class:`~kvwatch.core.diagnose.conditions.RuleEval`, the
definition, also behind ``kvwatch explain``). Every :class:`TargetResult` — state,
diagnoses with evidence and triage text, blind spots, facts, mode verdicts, rule checks
with their unknown signals, ``points`` and ``parts`` — must be equal, on fleets built to
reach every branch of a condition: missing and silent signals, NaN and ±Inf samples,
quantiles clamped at the histogram ceiling or interpolated in the threshold's bucket,
replica groups, stale targets, and simulated engines of every dialect.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from kvwatch.config import load_settings
from kvwatch.core.collect import resolve
from kvwatch.core.diagnose import Params, diagnose
from kvwatch.core.dialects import SourceKind
from kvwatch.core.frame import FleetData
from kvwatch.core.models import Target, TargetKey, TargetResult
from kvwatch.core.rules import RuleSet, default_rules_dir, load_ruleset
from kvwatch.core.signals import Signal
from kvwatch.demo import WARMUP_S, fleet_duration
from kvwatch.demo.fleet import SCRAPE_S, DemoFleet, simulate_fleet
from kvwatch.demo.inprocess import exposed, fleet_data, latency_window
from kvwatch.sim.randomized import draw_corpus

#: rules that reach what the bundled ones do not: a `not` at the root, == and !=, fact
#: thresholds, missing: true, a guard under `any`, a ratio of latency quantiles
EXTRA_RULES = """
version: 1
rules:
  - id: extra-not-root
    mode: idle
    for: 5m
    summary: "not root {kv_usage.p90:.0%} {window.waiting.max:.1f} {headroom_requests:.0f}"
    triage: ["[[queue {queue_p99.last:.2f}s]] and {ttft_p99.p99:.2f}s"]
    when:
      not:
        any:
          - {signal: kv_usage, stat: max, op: ">=", value: 0.3}
          - {signal: running, stat: mean, op: "!=", value: 0, missing: "true"}
  - id: extra-ops
    mode: misread
    for: 15m
    summary: "ops {ttft_tail_ratio.median:.1f} {group_size:g}"
    triage: ["{window.ttft_p99.max:.2f} {ttft_p50.min:.2f}"]
    when:
      all:
        - {signal: waiting, stat: last, op: "==", value: 0, guard: true}
        - any:
            - {signal: ttft_p99, stat: max, op: ">", ref: ttft_slo, value: 1.5}
            - {signal: ttft_tail_ratio, stat: mean, op: ">=", value: 3}
            - {fact: kv_usage_vs_group, op: ">=", value: 0.2, guard: true}
        - not: {signal: queue_p99, stat: p90, op: "<", value: 0.5, missing: "false"}
        - {signal: itl_p99, stat: frac_above, arg: 0.1, op: "<=", value: 0.9, missing: "true"}
  - id: extra-swings
    mode: oscillating
    for: 20m
    summary: "swings {kv_cycles:g} {period_minutes:.1f}"
    triage: ["{kv_usage.range:.0%}"]
    when:
      any:
        - {signal: kv_usage, stat: swing_episodes, arg: 0.2, op: ">=", value: 1, over: window}
        - {signal: completion_rate, stat: slope, op: "<", value: 0, guard: true}
        - {signal: ttft_mean, stat: median, op: ">", ref: ttft_slo}
"""

BUNDLED = load_ruleset()
STEP = 30.0
WINDOW = 1800.0
N = int(WINDOW // STEP) + 1
GRID = 1_000_000.0 + STEP * np.arange(N)
AT = float(GRID[-1])
LATENCY = (Signal.TTFT_P50, Signal.TTFT_P99, Signal.QUEUE_P99, Signal.ITL_P99, Signal.TPOT_P99)
LAYOUTS = (
    (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0),
    (0.1, 0.5, 1.0, 1.5, 2.5, 4.0),
    (0.05, 0.2, 1.0, 3.0),
)


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> RuleSet:
    extra = tmp_path_factory.mktemp("rules") / "extra.yaml"
    extra.write_text(EXTRA_RULES)
    return load_ruleset([default_rules_dir(), extra])


def _series(rng: np.random.Generator, sig: Signal) -> np.ndarray:
    """Values near the thresholds the rules use, in every shape they tell apart."""
    t = GRID - GRID[0]
    scale = {Signal.KV_USAGE: 1.0, Signal.RUNNING: 40.0, Signal.MAX_RUNNING: 40.0, Signal.WAITING: 6.0,
             Signal.WAITING_CAPACITY: 4.0, Signal.PREEMPTIONS: 0.5, Signal.GEN_TPS: 2000.0,
             Signal.PROMPT_TPS: 6000.0, Signal.REQUEST_RATE: 4.0, Signal.ABORT_RATE: 1.0,
             Signal.KV_CAPACITY_TOKENS: 200_000.0}.get(sig, 3.0)
    level = float(rng.choice([0.0, 0.0001, 0.05, 0.2, 0.5, 0.7, 0.85, 0.9, 0.95, 1.0, 1.2]))
    shape = int(rng.integers(7))
    if shape == 0:
        v = np.full(N, level)
    elif shape == 1:
        period = float(rng.choice([180.0, 300.0, 420.0, 900.0]))
        v = level / 2 + (0.5 + level / 2) * (0.5 + 0.5 * np.sin(2 * np.pi * t / period))
    elif shape == 2:
        v = np.linspace(float(rng.uniform(0, 1)), level, N)
    elif shape == 3:
        v = np.where(np.arange(N) < int(rng.integers(N)), level, float(rng.uniform(0, 1.2)))
    elif shape == 4:
        v = level + rng.normal(0, 0.05, N)
    elif shape == 5:
        v = rng.integers(0, 3, N).astype(float) * level
    else:
        v = (rng.random(N) < 0.3) * float(rng.uniform(0.5, 1.2))
    v = np.clip(v * scale, 0, None)
    if sig is Signal.KV_USAGE:
        v = np.clip(v, 0, 1)
    if sig in (Signal.KV_CAPACITY_TOKENS, Signal.MAX_RUNNING):
        v = np.full(N, float(v[-1]))
    return v


def random_fleet(seed: int, n: int = 160) -> tuple[list[Target], FleetData]:
    """A fleet that reaches every branch of a condition, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    dialects = ("vllm-v1", "vllm-v1", "sglang", "trtllm-serve", "tgi", "dynamo-frontend", "stale")
    targets, data = [], FleetData(grid=GRID, targets={}, scrape_interval_s=rng.choice([None, 15.0, 60.0]))
    for i in range(n):
        dialect = str(rng.choice(dialects))
        t = Target(TargetKey(f"job{i % 3}", f"t{i}:8000"), dialect, dialect.split("-")[0],
                   f"m{int(rng.integers(4))}" if rng.random() < 0.8 else "", gone=bool(rng.random() < 0.5))
        targets.append(t)
        data.targets[t.key] = t
        sourced: set[Signal] = set()
        for sig in Signal:
            roll = rng.random()
            if (roll < 0.12 and sig is not Signal.KV_USAGE) or roll < 0.02:
                continue  # not exported
            sourced.add(sig)
            if roll < 0.17:
                continue  # exported, no data
            v = _series(rng, sig)
            if rng.random() < 0.15:  # scrape gaps
                v[rng.random(N) < 0.3] = np.nan
            if rng.random() < 0.1:  # stopped: nothing in the freshness span
                v[-int(rng.integers(5, 25)):] = np.nan
            if rng.random() < 0.03:
                v[int(rng.integers(N))] = float(rng.choice([np.inf, -np.inf]))
            if rng.random() < 0.03:
                v[:] = np.nan
            data.put(t.key, sig, v)
        data.sourced[t.key] = sourced
        if rng.random() < 0.7:  # histogram layouts; some quantiles clamp at the ceiling
            layout = LAYOUTS[int(rng.integers(len(LAYOUTS)))]
            data.buckets[t.key] = {s: layout for s in LATENCY if rng.random() < 0.8}
            data.ceilings[t.key] = {s: les[-1] for s, les in data.buckets[t.key].items()}
            for s, top in data.ceilings[t.key].items():
                v = data.values(t.key, s)
                if v is not None and rng.random() < 0.4:
                    v[rng.random(N) < float(rng.choice([0.05, 0.5, 1.0]))] = top
                    v[:] = np.minimum(v, top)
        elif rng.random() < 0.2:
            data.ceilings[t.key] = {}
    return targets, data


def check_identical(targets: list[Target], data: FleetData, rules: RuleSet, params: Params) -> tuple[TargetResult, ...]:
    fast = diagnose(targets, data, rules, params)
    ref = diagnose(targets, data, rules, params, reference=True)
    assert [r.target.key for r in fast] == [r.target.key for r in ref]
    for a, b in zip(fast, ref, strict=True):
        assert a == b, f"{a.target.key}: the fleet-wide evaluator differs from the per-target one"
    # `kvwatch explain` walks every condition (no short-circuit, so more evidence): same verdicts
    keys = frozenset(t.key for t in targets[::7])
    explained = {r.target.key: r for r in diagnose(targets, data, rules, params, explain=keys)}
    for r in fast:
        e = explained[r.target.key]
        assert e.state == r.state
        assert [c.verdict for c in e.checks] == [c.verdict for c in r.checks]
    return fast


def _notes(targets: list[Target], data: FleetData, rules: RuleSet, params: Params) -> Counter[str]:
    """How often each kind of condition outcome occurs (explain records every condition)."""
    res = diagnose(targets, data, rules, params, explain=frozenset(t.key for t in targets))
    kinds: Counter[str] = Counter()
    for r in res:
        for c in r.checks:
            kinds[c.verdict.value] += 1
            for cond in c.conditions:
                note = cond.note.split(" (")[0].split(":")[0] if cond.note else ("met" if cond.met else str(cond.met))
                kinds[note] += 1
    return kinds


@pytest.mark.parametrize("seed", range(6))
def test_random_fleets_are_diagnosed_identically(rules: RuleSet, seed: int) -> None:
    targets, data = random_fleet(seed)
    for at_back, step, slo in ((0, STEP, 2.0), (4, STEP, 0.5), (0, 60.0, 1.0)):
        params = Params(at=AT - at_back * STEP, window_s=WINDOW - 600 * (at_back > 0), step_s=step, ttft_slo_s=slo)
        check_identical(targets, data, rules, params)


def test_random_fleets_reach_every_branch_of_a_condition(rules: RuleSet) -> None:
    kinds: Counter[str] = Counter()
    states: Counter[str] = Counter()
    for seed in range(3):
        targets, data = random_fleet(seed)
        params = Params(at=AT, window_s=WINDOW, step_s=STEP)
        kinds += _notes(targets, data, rules, params)
        states.update(r.state.value for r in check_identical(targets, data, rules, params))
    for kind in ("matched", "not_matched", "undecidable", "met", "False", "None", "lower bound",
                 "beyond the last histogram bucket", "in the histogram bucket", "no data, counts as false",
                 "no data, counts as true", "no request finished", "no sample in the last 5m"):
        assert kinds[kind] >= 3, (kind, kinds)
    assert len(states) >= 5, states


def test_bench_fleet_is_diagnosed_identically(rules: RuleSet) -> None:
    """The fleet of benchmarks/diagnose_cost.py: every failure-mode signature, 300 targets."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "diagnose_cost.py"
    spec = importlib.util.spec_from_file_location("diagnose_cost", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rng = np.random.default_rng(0)
    targets = [Target(TargetKey("bench", f"t{i}:8000"), "vllm-v1", "vllm", f"m{i % 30}") for i in range(300)]
    data = FleetData(grid=mod.GRID, targets={t.key: t for t in targets})
    for i, t in enumerate(targets):
        sigs = mod._signals(i, rng)
        data.sourced[t.key] = set(sigs)
        for s, v in sigs.items():
            data.put(t.key, s, v)
    res = check_identical(targets, data, rules, Params(at=float(mod.GRID[-1]), window_s=mod.WINDOW, step_s=mod.STEP))
    assert len({r.state for r in res}) >= 5


def _layouts(fleet: DemoFleet, targets: list[Target], data: FleetData) -> None:
    """Each simulated target's histogram bucket bounds, as the collector measures them."""
    by_key = {t.key: t for t in targets}
    for run in fleet.runs:
        series = exposed(run)
        for key, t in by_key.items():
            if key.instance != run.spec.instance(8000) and not key.instance.endswith(run.spec.name):
                continue
            for sig, src in resolve(t).items():
                if src.kind is not SourceKind.HIST_QUANTILE:
                    continue
                les = sorted({float(lb["le"]) for lb in series.labels(f"{src.metric}_bucket")} - {float("inf")})
                if les:
                    data.buckets.setdefault(key, {})[sig] = tuple(le * src.scale for le in les)
                    data.ceilings.setdefault(key, {})[sig] = les[-1] * src.scale


@pytest.mark.slow
@pytest.mark.parametrize("source", ["demo", "randomized"])
def test_simulated_engines_are_diagnosed_identically(rules: RuleSet, source: str) -> None:
    """Simulated engines of every dialect (their real names, units and buckets): at the end
    of the run over the whole window, and at 6 instants 2 minutes apart over 20 minutes."""
    settings = load_settings(None, environ={})
    ev = settings.evaluation
    end = 1_800_000_000.0
    if source == "demo":
        fleet = simulate_fleet(1, duration_s=fleet_duration(settings), warmup_s=WARMUP_S,
                               scrape_s=SCRAPE_S, end_time=end)
    else:
        drawn = draw_corpus(12, 5, duration_s=fleet_duration(settings), end_time=end, workers=1)
        fleet = DemoFleet(tuple(d.run for d in drawn), end, SCRAPE_S, job="rnd")
    states: Counter[str] = Counter()
    for at, window in [(end, ev.window), *((end - k * 120.0, 1200.0) for k in range(6))]:
        grid = at - ev.step * np.arange(int(window // ev.step), -1, -1, dtype=float)
        targets, data = fleet_data(fleet, grid, ev.rate_window, latency_window(settings))
        _layouts(fleet, targets, data)
        assert any(data.ceilings.values()), "simulated histograms have bucket ceilings"
        params = Params(at=at, window_s=window, step_s=ev.step, ttft_slo_s=ev.ttft_slo)
        check_identical(targets, data, rules, params)  # with the extra rules
        states.update(r.state.value for r in check_identical(targets, data, BUNDLED, params))
    assert len(states) >= 5, states


def test_explain_finds_no_evidence_in_siblings_a_short_circuit_skips(tmp_path: Path) -> None:
    """`kvwatch explain` walks every condition to show it, including the siblings after a
    child that already decided its group. A met leaf there (under `not` twice, so it reads as
    support) once counted as "the known evidence points to the rule": an undecidable rule then
    pointed in explain but not in the service, and explain called the target `unknown` where
    the service said `oscillating` (random fleet 4 of the test above, once the refill clause
    gained an `any`). What a short circuit skips is recorded, never evidence."""
    f = tmp_path / "rules.yaml"
    f.write_text("""
version: 1
rules:
  - id: full-skipped-sibling
    mode: full
    severity: critical
    description: d
    summary: s
    when:
      all:
        - {signal: waiting, stat: min, op: ">=", value: 1}
        - not:
            all:
              - {signal: gen_tps, stat: last, op: ">", value: 1.0e9}
              - not: {signal: gen_tps, stat: last, op: ">", value: 0}
    triage: ["t"]
""")
    rules = load_ruleset([f])
    t = Target(TargetKey("vllm", "t"), "vllm-v1", "vllm", "m")
    data = FleetData(grid=GRID, targets={t.key: t})
    data.sourced[t.key] = {Signal.KV_USAGE, Signal.GEN_TPS}
    data.put(t.key, Signal.KV_USAGE, np.full(len(GRID), 0.5))
    data.put(t.key, Signal.GEN_TPS, np.full(len(GRID), 100.0))
    params = Params(at=AT, window_s=WINDOW, step_s=STEP)
    (fast,) = diagnose([t], data, rules, params)
    (shown,) = diagnose([t], data, rules, params, explain=frozenset({t.key}))
    assert [c.points for c in shown.checks] == [c.points for c in fast.checks] == [False]
    assert shown.state == fast.state
    # the skipped sibling is still shown
    assert any(c.stat == "last" and c.met is True and c.negated is False and c.path.endswith("not.all[1].not")
               for c in shown.checks[0].conditions), shown.checks[0].conditions
