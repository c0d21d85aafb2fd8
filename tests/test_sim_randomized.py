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


def test_draws_are_seeded_and_labelled_from_truth() -> None:
    a = draw_target(3, 99, Dialect.SGLANG_0_5, end_time=END)
    b = draw_target(3, 99, Dialect.SGLANG_0_5, end_time=END)
    assert (a.description, a.label.mode, a.label.cause, a.label.mechanism) == (
        b.description, b.label.mode, b.label.cause, b.label.mechanism)
    assert a.run.spec.expected is a.label.mode and not a.label.ambiguous


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


def test_exemptions_are_narrow() -> None:
    assert blind_to("full", frozenset({"waiting"})) == frozenset()  # preemptions still decide
    assert blind_to("full", frozenset({"waiting", "preemptions"})) == {"waiting", "preemptions"}
    assert blind_to("misread", frozenset({"ttft"})) == {"ttft"}
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
