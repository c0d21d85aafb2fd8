"""Randomized corpus: mechanism labels from ground truth, perturbations, honest exemptions."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kvwatch.core.dialects import DIALECT_BY_ID
from kvwatch.core.signals import Signal
from kvwatch.sim.fleet import make_targets, simulate
from kvwatch.sim.honest import blind_to, score_corpus
from kvwatch.sim.mechanism import label_trace
from kvwatch.sim.perturb import BASE, Variant, lacking, optional_families, write_variants
from kvwatch.sim.randomized import build, draw_target
from kvwatch.sim.trace import COUNTERS, GAUGES, Trace
from kvwatch.sim.vocab import Dialect, IdleCause, Mode

END = 1_780_000_000.0


@pytest.mark.parametrize(("preset", "mode", "cause"), [
    ("full", Mode.FULL, None),
    ("oscillating", Mode.OSCILLATING, None),
    ("fragmented", Mode.FRAGMENTED, None),
    ("idle-batch-limited", Mode.IDLE, IdleCause.BATCH_LIMITED),
    ("idle-stalled", Mode.IDLE, IdleCause.STALLED),
    ("idle-low-demand", Mode.IDLE, IdleCause.LOW_DEMAND),
    ("healthy-busy", Mode.HEALTHY, None),
    ("healthy-burst-ended", Mode.HEALTHY, None),
])
def test_binding_limit_labels_the_hand_built_presets(preset: str, mode: Mode, cause: IdleCause | None) -> None:
    """The engine's own record of which limit held the queue names each preset's mode."""
    spec = make_targets(preset, Dialect.VLLM_0_10, 2, run_s=2700)[0]
    run = simulate(spec, duration_s=2400, end_time=END)
    label = label_trace(run.traces[0])
    assert (label.mode, label.cause) == (mode, cause), label


def test_a_watermark_on_a_full_pool_is_not_a_policy_stall() -> None:
    """vLLM's 1 % watermark on an over-full pool: KV binds, not the admission policy."""
    from dataclasses import replace

    spec = make_targets("full", Dialect.VLLM_0_10, 0, run_s=2700)[0]
    seg = spec.replica.segments[0]
    wm = replace(seg, config=replace(seg.config, watermark_frac=0.01))
    spec = replace(spec, replica=replace(spec.replica, segments=(wm,)))
    label = label_trace(simulate(spec, duration_s=1200, end_time=END).traces[0])
    assert label.mode is Mode.FULL, label


@pytest.mark.parametrize("dialect", [Dialect.VLLM_0_10, Dialect.VLLM_V0_0_6, Dialect.VLLM_RAY])
def test_vllm_is_never_drawn_into_a_reservation_stall(dialect: Dialect) -> None:
    """vLLM allocates the blocks a request needs now and reserves nothing for its output, so a
    reserve-for-max-output stall is drawn only for engines that have one (SGLang, TRT-LLM)."""
    fams = {draw_target(i, 5, dialect, end_time=END, duration_s=600).family for i in range(40)}
    assert "reservation" not in fams
    assert "reservation" in {draw_target(i, 5, Dialect.SGLANG_0_5, end_time=END, duration_s=600).family
                             for i in range(40)}


def test_draws_are_seeded_and_labelled_from_truth() -> None:
    a = draw_target(3, 99, Dialect.SGLANG_0_5, end_time=END)
    b = draw_target(3, 99, Dialect.SGLANG_0_5, end_time=END)
    assert (a.description, a.label.mode, a.label.cause, a.label.mechanism) == (
        b.description, b.label.mode, b.label.cause, b.label.mechanism)
    assert a.run.spec.expected is a.label.mode and not a.label.ambiguous


def test_a_finer_scrape_interval_samples_the_same_draws_and_labels(tmp_path: Path) -> None:
    # ``classify.py --scrape-interval 5`` must score the same targets against the same truth:
    # only the scrapes change, not the draws or the binding limit read from the engine trace
    docs, steps = [], []
    for interval in (15.0, 5.0):
        out = tmp_path / f"s{interval:.0f}"
        docs.append(build(out, n=2, seeds=[99], variants=[BASE], end_time=END, workers=1,
                          scrape_interval_s=interval))
        lines = [ln for ln in (out / "fleet.om").read_text().splitlines() if ln and not ln.startswith("#")]
        first = lines[0].rsplit(" ", 2)[0]  # one series: its samples, in time order
        ts = [float(ln.rsplit(" ", 1)[1]) for ln in lines if ln.rsplit(" ", 2)[0] == first]
        steps.append(set(np.diff(ts)))
    labels = [[(t["instance"], t["draw"], t["expected"], t["cause"]) for t in d["targets"]] for d in docs]
    assert labels[0] == labels[1]
    assert [d["scrape_interval_s"] for d in docs] == [15.0, 5.0]
    assert steps == [{15.0}, {5.0}], steps


def _series(text: str) -> set[str]:
    return {line.split("{", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_dropping_a_signal_removes_exactly_its_series(tmp_path: Path) -> None:
    spec = make_targets("full", Dialect.TRTLLM_TRITON, 0, run_s=900)[0]
    run = simulate(spec, duration_s=600, end_time=END)
    write_variants([run], [BASE, Variant("no-waiting", drop="waiting")], tmp_path / "x.om", job="j")
    text = (tmp_path / "x.om").read_text()
    base = [ln for ln in text.splitlines() if 'job="j-base"' in ln]
    drop = [ln for ln in text.splitlines() if 'job="j-no-waiting"' in ln]
    assert any('request_type="waiting"' in ln for ln in base)
    assert not any('request_type="waiting"' in ln or "nv_inference_pending_request_count" in ln for ln in drop)
    assert any('request_type="scheduled"' in ln for ln in drop)  # the same family's other series stay
    assert lacking(Dialect.TRTLLM_TRITON, Variant("no-waiting", drop="waiting")) >= {"waiting", "ttft"}


@pytest.mark.parametrize("dialect", [Dialect.TGI, Dialect.DYNAMO_FRONTEND])
def test_a_kv_proxy_over_the_capacity_gauge_is_lost_with_it(dialect: Dialect) -> None:
    # these engines export no KV gauge: kvwatch divides a token/block count by the capacity
    # gauge, so a target without capacity shows no KV usage either (and may abstain)
    capacity = {f.partition("{")[0] for f in optional_families(dialect)["capacity"]}
    (kv,) = DIALECT_BY_ID[dialect.value].sources[Signal.KV_USAGE]
    assert capacity & set(kv.requires), kv.requires
    assert "kv_usage" in lacking(dialect, Variant("no-capacity", drop="capacity"))
    assert "kv_usage" not in lacking(dialect, Variant("no-ttft", drop="ttft"))
    assert "kv_usage" not in lacking(Dialect.VLLM_0_10, Variant("no-capacity", drop="capacity"))


def test_coarser_scrapes_resets_and_churn(tmp_path: Path) -> None:
    spec = make_targets("full", Dialect.VLLM_0_10, 0, run_s=2000)[0]
    run = simulate(spec, duration_s=1800, end_time=END)
    variants = [Variant("s60", every=4), Variant("reset", reset=True), Variant("churn", churn=True)]
    write_variants([run], variants, tmp_path / "x.om", job="j")
    rows: dict[str, list[tuple[str, float, float]]] = {}
    for ln in (tmp_path / "x.om").read_text().splitlines():
        m = re.match(r'(vllm:generation_tokens_total)\{(.*)\} (\S+) (\S+)$', ln)
        if m:
            job = re.search(r'job="([^"]+)"', m.group(2)).group(1)
            rows.setdefault(job, []).append((m.group(2), float(m.group(3)), float(m.group(4))))
    t60 = np.array([t for _, _, t in rows["j-s60"]])
    assert set(np.diff(t60)) == {60.0} and t60[-1] == END
    vals = np.array([v for _, v, _ in rows["j-reset"]])
    assert (np.diff(vals) < 0).sum() == 1  # one reset to (near) zero
    assert len({lab for lab, _, _ in rows["j-churn"]}) == 2  # the series changes identity once


def test_a_phase_variant_scrapes_each_target_off_the_grid_with_jitter(tmp_path: Path) -> None:
    # real Prometheus scrapes each target at its own offset into the interval, with jitter:
    # samples are not on the evaluation grid, and two targets are not on the same phase
    runs = [simulate(spec, duration_s=600, end_time=END)
            for spec in (make_targets("full", Dialect.VLLM_0_10, 0, run_s=900)[0],
                         make_targets("idle-low-demand", Dialect.VLLM_0_10, 1, run_s=900)[0])]
    write_variants(runs, [BASE, Variant("phase", phase=True)], tmp_path / "x.om", job="j")
    times: dict[tuple[str, str], list[float]] = {}
    for ln in (tmp_path / "x.om").read_text().splitlines():
        m = re.match(r'vllm:num_requests_running\{(.*)\} \S+ (\S+)$', ln)
        if m:
            job = re.search(r'job="([^"]+)"', m.group(1)).group(1)
            inst = re.search(r'instance="([^"]+)"', m.group(1)).group(1)
            times.setdefault((job, inst), []).append(float(m.group(2)))
    offsets = []
    for (job, _), t in times.items():
        t_arr = np.array(t)
        off = (t_arr - END) % 15.0
        if job == "j-base":
            assert set(off) == {0.0}
            continue
        assert (np.diff(t_arr) > 0).all() and np.diff(t_arr).min() >= 0.75 * 15 and np.diff(t_arr).max() <= 1.25 * 15
        assert len(set(np.round(off, 3))) > len(t) // 2  # jitter: not one offset for every scrape
        offsets.append(float(np.median(t_arr - np.round(t_arr / 15.0) * 15.0)))
    assert len(offsets) == 2 and abs(offsets[0] - offsets[1]) > 0.01, offsets
    # a scrape reads the state of its own time: a counter between the simulated instants around
    # it (interpolated), never a value from one interval earlier stamped later
    counters: dict[str, list[float]] = {}
    for ln in (tmp_path / "x.om").read_text().splitlines():
        m = re.match(r'vllm:generation_tokens_total\{(.*)\} (\S+) \S+$', ln)
        if m and 'instance="' + runs[0].spec.instance() in m.group(1):
            counters.setdefault(re.search(r'job="([^"]+)"', m.group(1)).group(1), []).append(float(m.group(2)))
    base, shifted = np.array(counters["j-base"]), np.array(counters["j-phase"])
    assert len(base) == len(shifted) and (np.diff(shifted) >= 0).all()
    assert (shifted[:-1] >= base[:-1]).all() and (shifted[:-1] <= base[1:]).all()
    assert (shifted[:-1] > base[:-1]).any()


def test_exemptions_are_narrow() -> None:
    assert blind_to("full", frozenset({"waiting"})) == frozenset()  # preemptions still decide
    assert blind_to("full", frozenset({"waiting", "preemptions"})) == frozenset()  # the queue-time histogram still decides
    assert blind_to("full", frozenset({"waiting", "preemptions", "queue_time"})) == {"waiting", "preemptions", "queue_time"}
    assert blind_to("healthy", frozenset({"waiting"})) == frozenset()
    assert blind_to("idle/stalled", frozenset({"waiting"})) == {"waiting"}  # nobody leaves a wedged queue
    # a nearly empty pool with a queue is batch-limited or stalled, not low demand: no queue evidence, no verdict
    assert blind_to("idle/low_demand", frozenset({"waiting", "queue_time"})) == {"waiting", "queue_time"}
    assert blind_to("idle/low_demand", frozenset({"waiting"})) == frozenset()
    assert blind_to("misread", frozenset({"ttft"})) == {"ttft"}
    assert blind_to("misread", frozenset({"waiting"})) == frozenset()  # preemptions rule out a queue-made tail
    assert blind_to("misread", frozenset({"waiting", "preemptions"})) == {"waiting", "preemptions"}
    assert blind_to("healthy", frozenset({"queue_time", "capacity"})) == frozenset()
    assert blind_to("healthy", frozenset({"ttft"})) == {"ttft"}  # the tail cannot be ruled out
    # fragmented and batch-limited differ only in whether running sits at its cap
    assert blind_to("fragmented", frozenset({"running"})) == blind_to("idle/batch_limited", frozenset({"running"}))
    assert blind_to("fragmented", frozenset({"token_counters", "request_counters"})) == frozenset()


def test_score_counts_unknown_as_a_miss_unless_exempt(tmp_path: Path) -> None:
    doc = build(tmp_path, n=2, seeds=[5], variants=[BASE], dialects=[Dialect.TRTLLM_SERVE_GEN_A], end_time=END,
                workers=1)
    results = {("rnd-base", t["instance"]): ("unknown", None, "blind-spot") for t in doc["targets"]}
    rep = score_corpus(doc, results, [BASE])
    assert len(rep.abstentions()) == 2 and not rep.scored()  # genA exports no KV: unknown is all it can say
    doc = build(tmp_path / "b", n=2, seeds=[5], variants=[BASE], dialects=[Dialect.VLLM_0_10], end_time=END,
                workers=1)
    results = {("rnd-base", t["instance"]): ("unknown", None, "blind-spot") for t in doc["targets"]}
    rep = score_corpus(doc, results, [BASE])
    assert not rep.abstentions() and all(v.got == "unknown" != v.expected for v in rep.scored())


def _trace(*, waiting_span: tuple[int, int] | None = None, slow: int = 0, queued_tail: int = 0,
           usage: float = 0.05, slow_since: int = 590) -> Trace:
    """A 40-minute ground-truth trace at 1 s steps: one request a second with a 50 ms first
    token, ``slow`` of the last ``slow_since`` taking 10 s; ``waiting_span`` (s) had a queue, and
    ``queued_tail`` requests that arrived then get their first token in the last 100 s."""
    n = 2400
    t = np.arange(n, dtype=float)
    gauges = np.zeros((n, len(GAUGES)))
    gauges[:, GAUGES.index("usage")] = usage
    gauges[:, GAUGES.index("running")] = 3.0
    arrival = t.copy()
    ttft = np.full(n, 0.05)
    if slow:
        ttft[np.linspace(n - slow_since, n - 20, slow).astype(int)] = 10.0
    if waiting_span:
        a, b = waiting_span
        gauges[a:b, GAUGES.index("waiting")] = 4.0
        if queued_tail:
            idx = np.arange(a, a + queued_tail)
            ttft[idx] = (n - 100 + (idx - a) * 90 / queued_tail) - arrival[idx]
    first = arrival + ttft
    keep = first <= t[-1]
    return Trace(None, None, t, gauges, np.zeros((n, len(COUNTERS))), np.zeros(0, dtype=int),  # type: ignore[arg-type]
                 np.zeros((0, 0)), first[keep], ttft[keep])


def test_a_tail_left_by_an_episode_that_ended_before_the_recent_span_is_not_misread() -> None:
    """Requests that queued in an episode 15 minutes ago reach their first token late; they
    carry the episode's tail, not a slice of the workload (failure-modes.md: a burst that
    ended long ago is not a current incident)."""
    label = label_trace(_trace(waiting_span=(1000, 1300), queued_tail=60))
    assert label.mode is Mode.HEALTHY, label  # recovered, not misread
    assert label.evidence["ttft_slow_n"] == 0


def test_an_empty_pool_that_queued_earlier_in_the_window_is_recovered_not_low_demand() -> None:
    """Low demand means over-provisioned with no queue over the window; a pool that held a
    sustained queue 15 minutes ago was short of capacity then (advice to shrink it is wrong)."""
    assert label_trace(_trace(waiting_span=(1000, 1300))).mode is Mode.HEALTHY
    assert label_trace(_trace()).cause is IdleCause.LOW_DEMAND


def test_misread_needs_a_slice_clearly_over_one_percent() -> None:
    """p99 > SLO exactly when > 1 % of requests are slow: a slice near 1 % sits on either side
    of the SLO by a Poisson draw, so its truth is ambiguous (redrawn), not misread."""
    clear = label_trace(_trace(slow=30))  # 5 % of 600
    assert clear.mode is Mode.MISREAD and clear.without_tail == "idle/low_demand", clear
    assert label_trace(_trace(slow=30, usage=0.5)).without_tail == "healthy"
    for near in (3, 7):  # 0.5 % and 1.2 % of 600: within two sd (2.4 requests) of 6
        assert label_trace(_trace(slow=near)).ambiguous, near
    assert label_trace(_trace(slow=0)).cause is IdleCause.LOW_DEMAND


def test_a_tail_that_began_minutes_ago_has_not_persisted() -> None:
    """30 slow requests in the last 4 minutes only: the tail has not persisted over the span
    (failure-modes.md: judgements require the condition to persist), so it is not yet misread."""
    assert label_trace(_trace(slow=30, slow_since=240)).ambiguous


def test_misread_scoring_abstains_where_the_engine_cannot_show_the_tail() -> None:
    """Without TTFT (Triton) a misread pool can only be read as what it is without the tail;
    without a queue gauge and preemptions (trtllm-serve gen A) a queue-made tail cannot be
    ruled out. Both are abstentions, documented; a wrong answer is still a miss."""
    doc = {"variants": [{"name": "base", "job": "j", "instances": ["a", "b", "c", "d"]}], "targets": [
        {"instance": "a", "dialect": "trtllm-triton", "expected": "misread", "cause": None,
         "persistent_queue": False, "without_tail": "idle/low_demand"},
        {"instance": "b", "dialect": "trtllm-triton", "expected": "misread", "cause": None,
         "persistent_queue": False, "without_tail": "idle/low_demand"},
        {"instance": "c", "dialect": "trtllm-serve-genA", "expected": "misread", "cause": None,
         "persistent_queue": False, "without_tail": "healthy"},
        {"instance": "d", "dialect": "vllm-0.10", "expected": "misread", "cause": None,
         "persistent_queue": False, "without_tail": "idle/low_demand"},
    ]}
    results = {("j", "a"): ("idle", "low_demand", "idle-low-demand"), ("j", "b"): ("healthy", None, "healthy"),
               ("j", "c"): ("unknown", None, "blind-spot"), ("j", "d"): ("idle", "low_demand", "idle-low-demand")}
    rep = score_corpus(doc, results, [BASE])
    assert sorted(v.instance for v in rep.abstentions()) == ["a", "c"]
    assert sorted(v.instance for v in rep.misses()) == ["b", "d"]  # d exports TTFT: it must see the tail


def test_a_tgi_reservation_stall_read_as_full_is_an_abstention() -> None:
    """TGI's allocator takes blocks for prompt + max_new_tokens at admission, and its only KV
    gauge (``tgi_batch_current_max_tokens``) counts them: a reservation-bound TGI pool reports
    itself full, so ``full`` is all that engine shows of a fragmented stall (failure-modes.md:
    fragmented needs the pool to *report* headroom). It is counted apart, not as a hit; any
    other wrong answer on TGI, and ``full`` on an engine that reports used blocks, stay misses."""
    doc = {"variants": [{"name": "base", "job": "j", "instances": ["a", "b", "c", "d"]}], "targets": [
        {"instance": i, "dialect": d, "expected": "fragmented", "cause": None, "persistent_queue": True}
        for i, d in (("a", "tgi"), ("b", "tgi"), ("c", "vllm-0.10"), ("d", "tgi"))]}
    results = {("j", "a"): ("full", None, "full-kv-pressure"), ("j", "b"): ("idle", "batch_limited", "x"),
               ("j", "c"): ("full", None, "full-kv-pressure"), ("j", "d"): ("fragmented", None, "f")}
    rep = score_corpus(doc, results, [BASE])
    assert [v.instance for v in rep.abstentions()] == ["a"]
    assert sorted(v.instance for v in rep.misses()) == ["b", "c"]
    assert [v.instance for v in rep.scored() if v.expected == v.got] == ["d"]
