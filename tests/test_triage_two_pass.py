"""Two-pass cycles: decision signals for every target, triage-only signals for flagged ones.

A cycle collects and diagnoses with the signals some rule condition (or the core itself)
reads, then fetches the signals only matched rules' text reads (``RuleSet.triage_signals``)
for the targets with a matched rule, in one call, and diagnoses those again. Every
``TargetResult`` must equal one pass of ``diagnose`` over data that hold every signal, on
random fleets that reach every branch of a condition and on simulated engines of every
dialect; a target without a matched rule never lists a triage-only signal as a blind spot.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np
import pytest
from test_diagnose_fast import AT, BUNDLED, STEP, WINDOW, random_fleet
from test_diagnose_fast import rules as rules  # the fixture: bundled + extra rules

from kvwatch.config import load_settings
from kvwatch.core.diagnose import Params, diagnose, with_rows
from kvwatch.core.frame import FleetData
from kvwatch.core.models import FailureMode, Target, TargetKey, TargetResult, Verdict
from kvwatch.core.rules import RuleSet, load_ruleset
from kvwatch.core.signals import Signal
from kvwatch.demo import WARMUP_S, fleet_duration
from kvwatch.demo.fleet import SCRAPE_S, simulate_fleet
from kvwatch.demo.inprocess import fleet_data, latency_window
from kvwatch.sim.vocab import Dialect


def only(data: FleetData, signals: Iterable[Signal], keys: Iterable[TargetKey] | None = None) -> FleetData:
    """``data`` with only the rows of ``signals`` (of ``keys``, default all): what a fetch of
    just those signals returns; sourced signals, ceilings and layouts are kept whole."""
    keep = set(signals)
    wanted = set(data.series) if keys is None else set(keys)
    series = {k: {s: v.copy() for s, v in sigs.items() if s in keep} for k, sigs in data.series.items() if k in wanted}
    return FleetData(grid=data.grid, targets=dict(data.targets), series={k: v for k, v in series.items() if v},
                     sourced=data.sourced, ceilings=data.ceilings, buckets=data.buckets,
                     rate_window_s=data.rate_window_s, scrape_interval_s=data.scrape_interval_s)


def two_pass(targets: list[Target], data: FleetData, rules: RuleSet, params: Params,
             explain: frozenset[TargetKey] = frozenset()) -> tuple[tuple[TargetResult, ...], list[list[TargetKey]]]:
    """Diagnose from the decision signals, fetching the triage-only ones from ``data`` on demand."""
    calls: list[list[TargetKey]] = []

    def fetch(keys: list[TargetKey]) -> FleetData:
        calls.append(list(keys))
        return only(data, rules.triage_signals(), keys)

    decided = only(data, rules.decision_signals())
    return diagnose(targets, decided, rules, params, explain=explain, triage=fetch), calls


def as_json(results: Iterable[TargetResult]) -> list[str]:
    return [json.dumps(r.to_json(), sort_keys=True) for r in results]


def check_two_pass(
    targets: list[Target], data: FleetData, rules: RuleSet, params: Params, explain: bool = True
) -> tuple[TargetResult, ...]:
    """Two passes give exactly one pass's results; returns them. The triage fetch is asked at most
    once, for the targets with a matched rule that export a triage-only signal (and at most those
    whose match the samples do not cover yet besides)."""
    one = diagnose(targets, data, rules, params)
    got, calls = two_pass(targets, data, rules, params)
    assert [r.target.key for r in got] == [r.target.key for r in one]
    for a, b in zip(got, one, strict=True):
        assert a == b, f"{a.target.key}: two passes differ from one"
    assert as_json(got) == as_json(one)
    triage = rules.triage_signals()
    exports = [r for r in one if triage & data.sourced.get(r.target.key, set())]
    flagged = {r.target.key for r in exports if any(c.verdict is Verdict.MATCHED for c in r.checks)}
    # a rule outcome that matched but did not stand (samples not covering its span yet, a blind
    # spot the engine cannot decide) may be fetched too: only targets left `unknown`
    pointing = {r.target.key for r in exports if r.state is FailureMode.UNKNOWN}
    assert len(calls) <= 1, calls
    asked = set(calls[0]) if calls else set()
    assert flagged <= asked <= flagged | pointing, (asked, flagged)
    if not explain:
        return one
    explained = frozenset(t.key for t in targets[::5])
    assert as_json(two_pass(targets, data, rules, params, explained)[0]) == as_json(
        diagnose(targets, data, rules, params, explain=explained))
    return one


def test_triage_signals_are_those_no_condition_reads(tmp_path: object) -> None:
    bundled = load_ruleset()
    # tpot_p99 decides since idle-compute-bound-tpot reads it (compute-bound where no TTFT is exported)
    assert bundled.triage_signals() == {Signal.ITL_P99}
    assert Signal.TPOT_P99 in bundled.decision_signals()
    # queue_p99 is read by a condition (the idle rules' guard): it decides
    assert Signal.QUEUE_P99 in bundled.decision_signals()
    # pool size and the concurrency cap feed facts every target reports, whatever the rules
    assert {Signal.KV_CAPACITY_TOKENS, Signal.MAX_RUNNING, Signal.WAITING} <= bundled.decision_signals()
    assert bundled.decision_signals() | bundled.triage_signals() == set(Signal)


def test_a_rule_reading_a_triage_signal_makes_it_decide(rules: RuleSet) -> None:
    # the extra rules compare itl_p99 in a condition: it leaves the triage-only signals and decides
    assert Signal.ITL_P99 in load_ruleset().triage_signals()
    assert rules.triage_signals() == frozenset() and Signal.ITL_P99 in rules.decision_signals()


@pytest.mark.parametrize("seed", range(3))
def test_random_fleets_two_passes_equal_one(rules: RuleSet, seed: int) -> None:
    targets, data = random_fleet(seed)
    for ruleset in (BUNDLED, rules):
        for at_back, step in ((0, STEP), (4, STEP), (0, 60.0)):
            params = Params(at=AT - at_back * STEP, window_s=WINDOW - 600 * (at_back > 0), step_s=step)
            check_two_pass(targets, data, ruleset, params, explain=at_back == 0 and step == STEP)


def test_random_fleet_lists_triage_gaps_only_with_a_matched_rule() -> None:
    targets, data = random_fleet(1)
    res = diagnose(targets, data, BUNDLED, Params(at=AT, window_s=WINDOW, step_s=STEP))
    names = {s.value for s in BUNDLED.triage_signals()}
    flagged = [r for r in res if any(c.verdict is Verdict.MATCHED for c in r.checks)]
    quiet = [r for r in res if r not in flagged]
    assert flagged and quiet

    def no_data(r: TargetResult) -> set[str]:
        return {m.split()[0] for m in r.missing_signals if m.endswith("(no data)") and m.split()[0] in names}

    def unexported(r: TargetResult) -> set[str]:
        return {m for m in r.missing_signals if m in names}

    assert any(no_data(r) for r in flagged), "a flagged target lists a triage signal without data"
    assert not any(no_data(r) for r in quiet), "a target without a matched rule lists none"
    assert any(unexported(r) for r in quiet), "one the engine does not export is listed all the same"
    # and no triage-only signal ever blocks a decision
    assert not any(set(r.blocking) & names for r in res)


def test_skipping_the_second_pass_would_show() -> None:
    """The comparison is sensitive: without the triage rows, flagged targets' text differs."""
    targets, data = random_fleet(2)
    params = Params(at=AT, window_s=WINDOW, step_s=STEP)
    one = diagnose(targets, data, BUNDLED, params)
    blind = diagnose(targets, only(data, BUNDLED.decision_signals()), BUNDLED, params,
                     triage=lambda keys: only(data, (), keys))
    differ = [a.target.key for a, b in zip(one, blind, strict=True) if a != b]
    assert differ
    assert all(any(c.verdict is Verdict.MATCHED for c in a.checks) for a in one if a.target.key in differ)


def test_with_rows_leaves_the_kept_data_alone() -> None:
    targets, data = random_fleet(3, n=20)
    decided = only(data, BUNDLED.decision_signals())
    before = {k: set(v) for k, v in decided.series.items()}
    keys = [t.key for t in targets[:5]]
    merged = with_rows(decided, only(data, BUNDLED.triage_signals()), keys, BUNDLED.triage_signals())
    assert {k: set(v) for k, v in decided.series.items()} == before
    for k in keys:
        want = {s for s in data.series.get(k, {}) if s in BUNDLED.triage_signals()}
        assert want <= set(merged.series.get(k, {}))
    other = FleetData(grid=data.grid[1:], targets={})
    with pytest.raises(ValueError):
        with_rows(decided, other, keys, BUNDLED.triage_signals())


@pytest.mark.slow
def test_simulated_engines_of_every_dialect_two_passes_equal_one(rules: RuleSet) -> None:
    """Every simulated dialect, in failure modes whose triage text reads ITL/TPOT, at the end
    of the run over the whole window and at an earlier instant over 20 minutes."""
    settings = load_settings(None, environ={})
    ev = settings.evaluation
    end = 1_800_000_000.0
    dialects = list(Dialect)
    presets = ("oscillating", "full", "healthy-busy", "idle-low-demand", "fragmented", "misread-tail")
    fleet = simulate_fleet(3, duration_s=fleet_duration(settings), warmup_s=WARMUP_S, scrape_s=SCRAPE_S,
                           end_time=end, presets=[presets[i % len(presets)] for i in range(len(dialects))],
                           dialects=dialects)
    flagged_with_triage = 0
    for at, window in ((end, ev.window), (end - 240.0, 1200.0)):
        grid = at - ev.step * np.arange(int(window // ev.step), -1, -1, dtype=float)
        targets, data = fleet_data(fleet, grid, ev.rate_window, latency_window(settings))
        assert {t.dialect for t in targets} >= {"vllm-v1", "sglang", "trtllm-serve", "tgi", "lmdeploy"}
        params = Params(at=at, window_s=window, step_s=ev.step, ttft_slo_s=ev.ttft_slo)
        check_two_pass(targets, data, rules, params)
        res = check_two_pass(targets, data, BUNDLED, params)
        for r in res:
            if any(c.verdict is Verdict.MATCHED for c in r.checks):
                rows = [data.values(r.target.key, s) for s in BUNDLED.triage_signals()]
                flagged_with_triage += any(v is not None and np.isfinite(v).any() for v in rows)
    assert flagged_with_triage >= 3, "flagged simulated targets hold ITL/TPOT data"
