"""Incremental collection (``kvwatch run``) equals a full fetch at the same instant.

Live: ``kvwatch simulate serve`` (several dialects and failure modes on a
compressed clock) scraped every second by a real Prometheus. Each cycle the
incremental evaluator fetches only the new steps plus the overlap; a plain
:func:`kvwatch.core.pipeline.evaluate` at the same instant fetches the whole window.
Per target: the same state, the same diagnoses and evidence, and the same
values on every step of every signal.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import numpy as np
import pytest
import requests
from support.prom import prometheus, require_binary

from kvwatch.config import Settings, load_settings
from kvwatch.core.frame import FleetData
from kvwatch.core.models import Evaluation, Target, TargetKey
from kvwatch.core.pipeline import collect_targets, evaluate, find_targets
from kvwatch.core.promclient import PromClient
from kvwatch.core.rules import RuleSet, load_ruleset
from kvwatch.core.signals import Signal
from kvwatch.service.incremental import IncrementalEvaluator, splice

STEP = 5.0
PRESETS = ("healthy-busy", "full", "oscillating", "idle-low-demand", "misread-tail", "fragmented")
DIALECTS = ("vllm-0.33", "sglang-0.5", "trtllm-serve", "vllm-v0-0.6")
pytestmark = pytest.mark.live  # the live simulator test waits on the wall clock


def _equal(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Same values on every step (NaN equals NaN; an absent row equals an all-NaN row)."""
    if a is None or b is None:
        other = b if a is None else a
        return other is None or bool(np.isnan(other).all())
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


def test_splice_shifts_and_keeps_static_rows_whole() -> None:
    key = TargetKey("j", "i")
    t = {key: Target(key, "vllm-v1", "vllm")}
    grid_old = 100.0 + STEP * np.arange(7)
    old = FleetData(grid=grid_old, targets=t, series={key: {Signal.KV_USAGE: np.arange(7.0),
                                                         Signal.MAX_RUNNING: np.full(7, 4.0)}})
    grid = grid_old + 2 * STEP  # two steps later; the new fetch covers the last three
    new = FleetData(grid=grid[-3:], targets=t, series={key: {Signal.KV_USAGE: np.array([50.0, 51.0, 52.0]),
                                                          Signal.MAX_RUNNING: np.full(3, 8.0)}})
    modes = {(key, Signal.KV_USAGE): "range", (key, Signal.MAX_RUNNING): "static"}
    out = splice(old, new, grid, modes, np.arange(7))
    np.testing.assert_array_equal(out.values(key, Signal.KV_USAGE), [2, 3, 4, 5, 50, 51, 52])
    np.testing.assert_array_equal(out.values(key, Signal.MAX_RUNNING), np.full(7, 8.0))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_binary("prometheus")
    work = tmp_path_factory.mktemp("incremental")
    log = work / "sim.log"
    with log.open("wb") as out:
        sim = subprocess.Popen(
            [sys.executable, "-m", "kvwatch.cli", "simulate", "serve", "--host", "127.0.0.1", "--port", "0",
             "--presets", *PRESETS, "--dialects", *DIALECTS, "--speed", "20"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline, url = time.monotonic() + 30, ""
        while not url:
            m = re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text(errors="replace"))
            assert sim.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            url = m.group(1) if m else ""
            time.sleep(0.1)
        cfg = ("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
               f"scrape_configs:\n  - job_name: sim\n    http_sd_configs:\n"
               f"      - url: {url}/sd\n        refresh_interval: 2s\n")
        with prometheus(config=cfg) as prom:
            yield prom
    finally:
        sim.terminate()
        sim.wait(timeout=10)


def _compare(inc: Evaluation, full: Evaluation, inc_data: FleetData, full_data: FleetData) -> list[str]:
    problems = []
    a = {r.target.key: r for r in inc.results}
    b = {r.target.key: r for r in full.results}
    if set(a) != set(b):
        return [f"targets differ: {set(a) ^ set(b)}"]
    for key, r in b.items():
        mine = a[key]
        if mine.state != r.state:
            problems.append(f"{key}: state {mine.state.value} != {r.state.value}")
        elif json.dumps(mine.to_json(), sort_keys=True) != json.dumps(r.to_json(), sort_keys=True):
            problems.append(f"{key}: results differ (evidence, facts, blind spots or rule checks)")
        if inc_data.ceilings.get(key) != full_data.ceilings.get(key):
            problems.append(f"{key}: bucket ceilings {inc_data.ceilings.get(key)} != {full_data.ceilings.get(key)}")
        if inc_data.buckets.get(key) != full_data.buckets.get(key):
            problems.append(f"{key}: bucket layouts {inc_data.buckets.get(key)} != {full_data.buckets.get(key)}")
        if [(d.mode, d.severity, d.summary) for d in mine.diagnoses] != [
                (d.mode, d.severity, d.summary) for d in r.diagnoses]:
            problems.append(f"{key}: diagnoses differ")
        for sig in set(full_data.series.get(key, {})) | set(inc_data.series.get(key, {})):
            if not _equal(inc_data.values(key, sig), full_data.values(key, sig)):
                problems.append(f"{key} {sig.value}: values differ")
    return problems


def _settings(url: str) -> Settings:
    return load_settings(None, environ={}, overrides={
        "prometheus": {"url": url, "timeout": "30s"},
        "evaluation": {"window": "2m", "step": f"{STEP:g}s", "rate_window": "20s", "latency_window": "100s",
                       "overlap": "10s"},
        "discovery": {"refresh_cycles": 3}})


def _past_instant(live: str, back_steps: int) -> datetime:
    """An aligned instant, waiting until Prometheus holds ``back_steps`` steps (and a bit) of scrapes."""
    need = back_steps * STEP + 15
    deadline = time.monotonic() + need + 60
    while time.monotonic() < deadline:
        res = requests.get(f"{live}/api/v1/query", params={"query": "min(count_over_time(up[10m]))"},
                           timeout=5).json()["data"]["result"]
        if res and float(res[0]["value"][1]) >= need:  # 1 s scrapes: scrapes held = seconds of history
            break
        time.sleep(2)
    return datetime.fromtimestamp(math.floor((time.time() - 2.5) / STEP) * STEP, tz=UTC)


def _full(live: str, settings: Settings, rules: RuleSet, at: datetime) -> tuple[Evaluation, FleetData]:
    ref = PromClient(live, timeout_s=30)
    full = evaluate(ref, settings, rules, at)
    return full, collect_targets(ref, settings, rules, find_targets(ref, settings, at), at,
                                 signals=rules.decision_signals())


def test_incremental_equals_full_fetch_on_a_live_simulator(live: str) -> None:
    settings = _settings(live)
    rules = load_ruleset()
    inc = IncrementalEvaluator()
    client = PromClient(live, timeout_s=30)
    # wait for a window's worth of scrapes of every simulated target
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        up = requests.get(f"{live}/api/v1/query", params={"query": "count(up == 1)"}, timeout=5).json()
        n = int(float(up["data"]["result"][0]["value"][1])) if up["data"]["result"] else 0
        if n >= len(PRESETS):
            break
        time.sleep(1)
    time.sleep(10)  # part of the window filled: early cycles splice gaps, later ones data
    modes, problems = [], []
    # a second service that ran the first cycle only and is called again at the last one: a gap
    # of several steps (a paused service, a slow Prometheus) shorter than the window splices too
    lagging = IncrementalEvaluator()
    for cycle, wait_steps in enumerate((0, 1, 2, 1, 3)):
        time.sleep(wait_steps * STEP)
        # a couple of seconds back: every scrape up to the instant is in Prometheus for both fetches
        at = datetime.fromtimestamp(math.floor((time.time() - 2.5) / STEP) * STEP, tz=UTC)
        got = inc(client, settings, rules, at)
        if cycle == 0:
            lagging(PromClient(live, timeout_s=30), settings, rules, at)
            first_at = at
        ref_client = PromClient(live, timeout_s=30)
        full = evaluate(ref_client, settings, rules, at)
        targets = find_targets(ref_client, settings, at)
        full_data = collect_targets(ref_client, settings, rules, targets, at, signals=rules.decision_signals())
        assert inc.data is not None
        problems += [f"cycle {cycle} ({inc.last_mode}): {p}" for p in _compare(got, full, inc.data, full_data)]
        modes.append((inc.last_mode, inc.last_steps, inc.last_discovered))
    late = lagging(PromClient(live, timeout_s=30), settings, rules, at)
    assert lagging.data is not None
    problems += [f"after a gap: {p}" for p in _compare(late, full, lagging.data, full_data)]
    gap = round((at - first_at).total_seconds() / STEP)
    assert not problems, "\n".join(problems[:20])
    unsettled = math.ceil(settings.evaluation.overlap / STEP) - 1  # kept steps read again
    assert gap >= 7 and lagging.last_mode == "incremental" and lagging.last_steps >= gap + unsettled, (
        gap, lagging.last_mode, lagging.last_steps)
    assert modes[0][0] == "full" and [m for m, _, _ in modes[1:]].count("incremental") >= 3, modes
    assert any(not d for _, _, d in modes[1:]), f"discovery never skipped: {modes}"
    assert all(s < 24 for m, s, _ in modes if m == "incremental"), modes  # a fraction of the 24-step window
    states = {r.state.value for r in got.results}
    assert len(got.results) >= len(PRESETS) and len(states) >= 2, states


def test_a_rediscovered_target_is_fetched_whole_with_its_bucket_ceilings(live: str) -> None:
    """A target whose discovery changed is fetched over the whole window, with everything a full
    fetch measures for it (its histogram bounds included), while the others splice."""
    settings, rules = _settings(live), load_ruleset()
    at = _past_instant(live, 2)
    inc, client = IncrementalEvaluator(), PromClient(live, timeout_s=30)
    inc(client, settings, rules, datetime.fromtimestamp(at.timestamp() - 2 * STEP, tz=UTC))
    assert inc.data is not None
    with_ceilings = sorted((k for k, c in inc.data.ceilings.items() if c), key=lambda k: (k.job, k.instance))
    assert with_ceilings, "the simulated fleet exports latency histograms"
    # as if this target had not been there last cycle (a new replica, a changed dialect)
    inc.data.targets.pop(with_ceilings[0])
    inc.data.series.pop(with_ceilings[0], None)
    inc.data.ceilings.pop(with_ceilings[0])
    inc.data.buckets.pop(with_ceilings[0])
    got = inc(client, settings, rules, at)
    assert inc.last_mode == "incremental", inc.last_mode
    full, full_data = _full(live, settings, rules, at)
    problems = _compare(got, full, inc.data, full_data)
    assert not problems, "\n".join(problems[:20])


def test_quantiles_of_one_bucket_query_equal_histogram_quantile(live: str) -> None:
    """TTFT p50 and p99 computed by kvwatch from one ``sum by (job, instance, le)`` answer per
    family equal Prometheus' own ``histogram_quantile`` on every step of every target, and so do
    the results: the whole window (coarse latency samples) and a steady increment."""
    from kvwatch.core.collect import collect
    from kvwatch.core.diagnose import Params, diagnose
    from kvwatch.durations import format_duration

    settings, rules = _settings(live), load_ruleset()
    at = _past_instant(live, 24)
    client = PromClient(live, timeout_s=30)
    targets = find_targets(client, settings, at)
    ev = settings.evaluation
    merged_any = False
    for window in (ev.window, 4 * STEP):
        got: dict[bool, FleetData] = {}
        queries: dict[bool, int] = {}
        for merge in (True, False):
            before = client.stats.queries
            got[merge] = collect(
                client, targets, at=at, window_s=window, step_s=ev.step,
                rate_window=format_duration(ev.rate_window), latency_window=format_duration(ev.latency_window),
                range_signals=rules.condition_signals(), user_matchers="", merge_quantiles=merge)
            queries[merge] = client.stats.queries - before
        merged_any |= queries[True] < queries[False]
        a, b = got[True], got[False]
        quantiles = {Signal.TTFT_P50, Signal.TTFT_P99}
        checked = 0
        for key in b.targets:
            for sig in set(a.series.get(key, {})) | set(b.series.get(key, {})):
                assert _equal(a.values(key, sig), b.values(key, sig)), (window, key, sig)
                checked += sig in quantiles and not np.isnan(b.values(key, sig)).all()  # type: ignore[union-attr]
        assert checked >= 4, "the simulated fleet exports TTFT histograms with observations"
        params = Params(at=at.timestamp(), window_s=window, step_s=ev.step, ttft_slo_s=ev.ttft_slo)
        mine, theirs = (diagnose(targets, d, rules, params) for d in (a, b))
        assert [json.dumps(r.to_json(), sort_keys=True) for r in mine] == [
            json.dumps(r.to_json(), sort_keys=True) for r in theirs]
    assert merged_any, "p50 and p99 of a family were fetched as one bucket query"


def test_two_pass_cycle_equals_one_pass_over_every_signal(live: str) -> None:
    """``evaluate`` collects the decision signals, then the triage-only ones (ITL/TPOT p99) for
    the targets with a matched rule only: its results are exactly one diagnosis of a fetch of
    every signal, and the triage fetch sends one query per (signal, source) for those targets
    together (restricted to their instances), never one per target."""
    from kvwatch.core.diagnose import Params, diagnose
    from kvwatch.core.models import Verdict
    from kvwatch.core.scrape import rate_window

    settings, rules = _settings(live), load_ruleset()
    at = _past_instant(live, 24)
    client = PromClient(live, timeout_s=30)
    sent: list[str] = []
    instant, ranged = client.instant, client.range

    def rec_instant(q: str, when: datetime) -> list:
        sent.append(q)
        return instant(q, when)

    def rec_range(q: str, start: datetime, end: datetime, step: float) -> list:
        sent.append(q)
        return ranged(q, start, end, step)

    client.instant, client.range = rec_instant, rec_range  # type: ignore[method-assign]
    got = evaluate(client, settings, rules, at)
    ref = PromClient(live, timeout_s=30)
    targets = find_targets(ref, settings, at)
    data = collect_targets(ref, settings, rules, targets, at)  # every signal, one pass
    ev = settings.evaluation
    params = Params(at=at.timestamp(), window_s=ev.window, step_s=ev.step, ttft_slo_s=ev.ttft_slo,
                    latency_window_s=rate_window(ev.latency_window, data.scrape_interval_s))
    one = diagnose(targets, data, rules, params)
    assert [json.dumps(r.to_json(), sort_keys=True) for r in got.results] == [
        json.dumps(r.to_json(), sort_keys=True) for r in one]
    triage = rules.triage_signals()
    flagged = [r.target for r in one if any(c.verdict is Verdict.MATCHED for c in r.checks)
               and triage & data.sourced.get(r.target.key, set())]
    assert flagged, "the simulated fleet has flagged targets that export ITL or TPOT"
    from kvwatch.core.collect import resolve
    metrics = {src.metric for t in targets for sig, src in resolve(t).items() if sig in triage}
    fetched = [q for q in sent if any(m in q for m in metrics) and not q.startswith("group by")]
    pairs = {(sig, src) for t in flagged for sig, src in resolve(t).items() if sig in triage}
    assert 0 < len(fetched) <= len(pairs), (fetched, pairs)
    if len(flagged) <= len(targets) / 2:  # few: only their instances' series are selected
        assert all("instance=~" in q for q in fetched), fetched
    got_flagged = [r for r in got.results if r.target in flagged]
    assert any(not any(m.startswith(("itl_p99 (no", "tpot_p99 (no")) for m in r.missing_signals)
               for r in got_flagged), "some flagged target's triage signals hold data"


class _Recording(PromClient):
    """A PromClient that keeps every range query it sends."""

    def __init__(self, url: str) -> None:
        super().__init__(url, timeout_s=30)
        self.sent: list[str] = []
        self.starts: list[tuple[str, float]] = []  # (query, range start in Unix s)

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list:  # type: ignore[override]
        self.sent.append(query)
        self.starts.append((query, start.timestamp()))
        return super().range(query, start, end, step_s)


def test_a_steady_cycle_probes_for_relabel_leftovers_once(live: str) -> None:
    """The relabel-leftover probe (kvwatch/core/churn.py) runs once per KV family in a steady
    cycle, and the spliced window carries what it found: the triage pass reads its signals at
    the instant, inside the span just probed, and reuses that finding instead of probing again
    (a finding kept from an older cycle would be stale)."""
    settings, rules = _settings(live), load_ruleset()
    inc = IncrementalEvaluator()
    inc(PromClient(live, timeout_s=30), settings, rules, _past_instant(live, 10))
    time.sleep(2 * STEP)
    client = _Recording(live)
    inc(client, settings, rules, datetime.fromtimestamp(math.floor((time.time() - 2.5) / STEP) * STEP, tz=UTC))
    assert inc.last_mode == "incremental", inc.last_mode
    assert inc.data is not None and inc.data.leftovers == frozenset()  # probed this cycle: none
    probes = [q for q in client.sent if "last_over_time(" in q and "@ end()" in q]
    families = {re.search(r"count by \(job, instance\) \((\w[^{]*)", q).group(1) for q in probes}  # type: ignore[union-attr]
    assert probes and len(probes) == len(families), probes


def test_a_steady_cycle_rereads_no_step_that_had_settled(live: str) -> None:
    """A step ``overlap`` or more older than the last cycle's instant had all its samples then:
    a steady cycle fetches only the steps after that (the overlap's unsettled ones and the
    new ones), for range rows and coarse latency rows alike. Re-reading a settled step costs
    Prometheus a point per series for a value the kept window already holds."""
    settings, rules = _settings(live), load_ruleset()
    inc = IncrementalEvaluator()
    before = _past_instant(live, 10)
    inc(PromClient(live, timeout_s=30), settings, rules, before)
    client = _Recording(live)
    inc(client, settings, rules, datetime.fromtimestamp(before.timestamp() + 2 * STEP, tz=UTC))
    assert inc.last_mode == "incremental", inc.last_mode
    settled = before.timestamp() - settings.evaluation.overlap  # and every step before it
    reread = sorted({(start, q[:90]) for q, start in client.starts if start <= settled})
    assert client.starts and not reread, f"settled steps fetched again (settled up to {settled}): {reread[:5]}"
    assert inc.last_steps == 2 + math.ceil(settings.evaluation.overlap / STEP) - 1, inc.last_steps
