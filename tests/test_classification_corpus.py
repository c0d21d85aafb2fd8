"""Classification quality on a labelled, simulated corpus in a real Prometheus.

Every preset of the simulator (each failure mode, idle sub-causes and hard
healthy cases) x 4 seeds, rotating through all 10 dialects, is backfilled with
promtool and evaluated by the real pipeline at the corpus end instant. The
simulator checks each label against its own ground truth before we trust it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.prom import backfill, prometheus
from support.victoria import import_openmetrics, victoriametrics

from kvwatch.config import load_settings
from kvwatch.core.collect import resolve
from kvwatch.core.pipeline import evaluate
from kvwatch.core.promclient import PromClient
from kvwatch.core.quality import MODES, score, static_baseline
from kvwatch.core.rules import load_ruleset
from kvwatch.sim.corpus import build_corpus

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    work: Path = tmp_path_factory.mktemp("corpus")
    return work, build_corpus(work, seeds=4)


@pytest.fixture(scope="module")
def corpus(corpus_files: tuple[Path, dict]) -> tuple[dict, dict, set[str]]:
    work, doc = corpus_files
    backfill(work / "fleet.om", work / "tsdb")
    at = datetime.fromtimestamp(doc["end_unix"], tz=UTC)
    with prometheus(work / "tsdb") as url:
        client = PromClient(url, timeout_s=120)
        ev = evaluate(client, load_settings(None, environ={}), load_ruleset(), at)
        baseline = static_baseline(client, at)
    return doc, {r.target.key.instance: r for r in ev.results}, baseline


def _observable(result, expected: dict) -> bool:
    """Whether the target's dialect exports what its expected mode's signature needs."""
    sourced = {s.value for s in resolve(result.target)}
    if "kv_usage" not in sourced:
        return False
    if expected["expected"] == "misread" and not expected["group"]:
        return "ttft_p99" in sourced  # the tail signature needs a TTFT histogram
    if expected["cause"] == "compute_bound":
        return "ttft_p50" in sourced
    if expected["expected"] == "healthy":
        # healthy means every mode was decided: without TTFT the tail and compute-bound
        # signatures cannot be ruled out, so such a target is `unknown` by contract
        return {"ttft_p50", "ttft_p99"} <= sourced
    return True


def test_corpus_is_large_varied_and_validated(corpus) -> None:
    doc, results, _ = corpus
    targets = doc["targets"]
    assert len(targets) >= 50
    assert {t["dialect"] for t in targets} >= {
        "vllm-0.33", "vllm-0.10", "vllm-0.8.2", "vllm-v0-0.6", "sglang-0.5", "sglang-0.4.0",
        "sglang-underscore", "trtllm-triton", "trtllm-serve", "trtllm-serve-genA",
    }
    assert {t["expected"] for t in targets} == set(MODES)
    # the simulator's own ground truth shows each label's signature
    assert all(t["validation"]["ok"] for t in targets), [t["name"] for t in targets if not t["validation"]["ok"]]
    assert set(results) == {t["instance"] for t in targets}, "every target reported exactly once"


def test_per_mode_precision_recall_and_no_false_alarms(corpus) -> None:
    doc, results, _ = corpus
    pairs, wrong = [], []
    for t in doc["targets"]:
        r = results[t["instance"]]
        if not _observable(r, t):
            continue
        pairs.append((t["expected"], r.state.value))
        if r.state.value != t["expected"]:
            wrong.append((t["instance"], t["expected"], r.state.value))
    rep = score(pairs)
    print("\n" + rep.table())
    assert rep.total >= 45
    assert rep.healthy_false_alarms == 0, wrong
    assert rep.macro_f1 >= 0.95, wrong
    for s in rep.scores:
        assert s.precision >= 0.85 and s.recall >= 0.85, (s, wrong)


def test_idle_sub_causes_are_told_apart(corpus) -> None:
    doc, results, _ = corpus
    checked = 0
    for t in doc["targets"]:
        r = results[t["instance"]]
        if t["expected"] == "idle" and _observable(r, t):
            assert r.primary is not None and r.primary.cause == t["cause"], (t["instance"], r.primary)
            checked += 1
    assert checked >= 8


def test_blind_spots_are_reported_not_guessed(corpus) -> None:
    doc, results, _ = corpus
    blind = [(t, results[t["instance"]]) for t in doc["targets"] if not _observable(results[t["instance"]], t)]
    assert blind, "the corpus should contain dialects that cannot show some signatures"
    for t, r in blind:
        if "kv_usage" not in {s.value for s in resolve(r.target)}:
            assert r.state.value == "unknown" and "kv_usage" in r.missing_signals
        else:
            # e.g. Triton exports no TTFT histogram: the tail rule is undecidable and says so
            assert any(m.startswith("rule ") and "undecidable" in m for m in r.missing_signals), r.missing_signals
            # contract: a mode that cannot be decided is never reported healthy (issue 11)
            assert r.state.value in ("unknown", "idle", t["expected"]), (t["instance"], r.state.value)


def test_misread_imbalance_is_reported_on_the_saturated_replica(corpus) -> None:
    doc, results, _ = corpus
    groups = [g for g in doc["groups"] if g["expected"] == "misread"]
    assert groups
    for g in groups:
        flagged = [
            i for i in g["members"] if any(d.rule_id == "misread-replica-imbalance" for d in results[i].diagnoses)
        ]
        assert len(flagged) == 1, (g["name"], [(i, results[i].state.value) for i in g["members"]])


def test_static_threshold_baseline_is_far_worse(corpus) -> None:
    """The usual `min_over_time(kv_usage[5m]) > 0.9` alert, scored on the same corpus."""
    doc, results, fired = corpus
    kv_pairs, base_pairs = [], []
    for t in doc["targets"]:
        r = results[t["instance"]]
        if not _observable(r, t):
            continue
        kv_pairs.append((t["expected"], r.state.value))
        base_pairs.append((t["expected"], "full" if t["instance"] in fired else "healthy"))
    ours, base = score(kv_pairs), score(base_pairs)
    print(f"\nkvwatch macro-F1 {ours.macro_f1:.3f} vs static threshold {base.macro_f1:.3f}")
    assert fired, "the baseline fires on the pinned pools"
    assert ours.macro_f1 > base.macro_f1 + 0.4


def test_victoriametrics_gives_the_same_states(corpus_files: tuple[Path, dict], corpus) -> None:
    """The same samples in VictoriaMetrics: every target gets the state (and modes) Prometheus gave."""
    work, doc = corpus_files
    _, prom_results, _ = corpus
    at = datetime.fromtimestamp(doc["end_unix"], tz=UTC)
    with victoriametrics() as url:
        assert import_openmetrics(url, work / "fleet.om") > 1_000_000
        client = PromClient(url, timeout_s=120)
        ev = evaluate(client, load_settings(None, environ={}), load_ruleset(), at)
    vm = {r.target.key.instance: r for r in ev.results}
    assert set(vm) == set(prom_results) and len(vm) >= 50
    diffs = {k: (prom_results[k].state.value, vm[k].state.value) for k in vm
             if vm[k].state != prom_results[k].state}
    assert not diffs, diffs
    modes = {k: {d.mode for d in r.diagnoses} for k, r in vm.items()}
    assert modes == {k: {d.mode for d in r.diagnoses} for k, r in prom_results.items()}
    assert client.stats.errors == 0
