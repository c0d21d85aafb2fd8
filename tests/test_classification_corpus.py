"""Classification quality on a randomized, mechanism-labelled corpus in a real Prometheus.

48 engines are drawn from wide simulator ranges (kvwatch.sim.randomized) and labelled by
the limit that binds in the simulator's ground truth, never by kvwatch's thresholds. The
base corpus and, for a seeded quarter of the targets, four perturbations (preemptions
dropped, 60 s scrapes, scrape gaps, a counter reset) are backfilled with promtool and
evaluated once by the real pipeline (the simulated corpus and its TSDB blocks are cached,
keyed by the generator's code: tests/support/cache.py). Every target counts: ``unknown`` is a miss unless the
target cannot export what decides its label (kvwatch.sim.honest).
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.cache import generated
from support.prom import backfill, prometheus

from kvwatch.config import load_settings
from kvwatch.core.pipeline import evaluate
from kvwatch.core.promclient import PromClient
from kvwatch.core.quality import score, static_baseline_targets
from kvwatch.core.rules import load_ruleset
from kvwatch.sim import perturb
from kvwatch.sim.honest import HonestReport, score_corpus
from kvwatch.sim.randomized import build

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

SEED = 5
VARIANTS = (perturb.BASE, perturb.Variant("no-preemptions", drop="preemptions"),
            perturb.Variant("scrape-60s", every=4), perturb.Variant("gaps", gaps=True),
            perturb.Variant("reset", reset=True))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, HonestReport, dict, set[tuple[str, str]]]:
    work: Path = tmp_path_factory.mktemp("rnd")

    def make(out: Path) -> None:  # the simulation and promtool's blocks: cached by generator code
        build(out, n=48, seeds=[SEED], variants=VARIANTS, share=0.25)
        backfill(out / "fleet.om", out / "tsdb")
        (out / "fleet.om").unlink()

    data = generated("classification-corpus", {"n": 48, "seeds": [SEED], "variants": VARIANTS, "share": 0.25},
                     ("kvwatch.sim.randomized", "kvwatch.sim.perturb"), make, work)
    doc = json.loads((data / "manifest.json").read_text())
    shutil.copytree(data / "tsdb", work / "tsdb-copy")  # Prometheus writes to its TSDB; the cache stays as made
    at = datetime.fromtimestamp(doc["end_unix"], tz=UTC)
    with prometheus(work / "tsdb-copy") as url:
        client = PromClient(url, timeout_s=120)
        ev = evaluate(client, load_settings(None, environ={}), load_ruleset(), at)
        fired = static_baseline_targets(client, at)
    results = {}
    for r in ev.results:
        p = r.primary
        results[(r.target.key.job, r.target.key.instance)] = (r.state.value, p.cause if p else None,
                                                              p.rule_id if p else "")
    return doc, score_corpus(doc, results, VARIANTS), results, fired


def _misses(rep: HonestReport) -> list[tuple[str, str, str, str]]:
    return [(v.variant, v.instance, v.expected, v.got) for v in rep.misses()]


def test_corpus_is_varied_and_every_target_is_reported(corpus) -> None:
    doc, rep, results, _ = corpus
    targets = doc["targets"]
    assert len(targets) == 48
    assert len({t["dialect"] for t in targets}) >= 8
    assert len({t["family"] for t in targets}) >= 8
    assert {t["expected"] for t in targets} >= {"healthy", "full", "idle", "oscillating", "fragmented", "misread"}
    for v in doc["variants"]:
        for inst in v["instances"]:
            assert (v["job"], inst) in results, f"{v['job']}/{inst} not reported"
    assert not any(v.got == "missing" for v in rep.verdicts)
    print("\n" + json.dumps({"redrawn": sum(t["redrawn"] for t in targets),
                             "labels": sorted({t["expected"] for t in targets})}))


def test_per_mode_precision_recall_counting_every_target(corpus) -> None:
    _, rep, _, _ = corpus
    overall = rep.modes()
    print("\n" + overall.table())
    base = rep.modes("base")
    assert overall.total >= 60
    assert base.macro_f1 >= 0.9, _misses(rep)
    assert overall.macro_f1 >= 0.9, _misses(rep)
    for s in overall.scores:
        if s.support >= 3:
            assert s.precision >= 0.8 and s.recall >= 0.75, (s, _misses(rep))


def test_no_healthy_target_flagged_and_no_queue_called_healthy(corpus) -> None:
    _, rep, _, _ = corpus
    assert not rep.healthy_flagged(), rep.healthy_flagged()  # in every variant
    assert not rep.queue_called_healthy(), rep.queue_called_healthy()
    failed = rep.failure_called_healthy()
    assert len(failed) <= 0.1 * len(rep.scored()), failed


def test_idle_sub_causes_are_told_apart(corpus) -> None:
    _, rep, _, _ = corpus
    idle = [v for v in rep.scored("base") if v.expected.startswith("idle/")]
    right = [v for v in idle if v.got == v.expected]
    assert len(idle) >= 5 and len(right) >= 0.8 * len(idle), [(v.instance, v.expected, v.got) for v in idle]


def test_static_threshold_baseline_is_far_worse(corpus) -> None:
    """The usual `min_over_time(kv_usage[5m]) > 0.9` alert, scored on the same target-variants."""
    doc, rep, _, fired = corpus
    pairs = [(v.expected.split("/")[0], "full" if (f"{doc['job']}-{v.variant}", v.instance) in fired else "healthy")
             for v in rep.scored()]
    ours, base = rep.modes(), score(pairs)
    print(f"\nkvwatch macro-F1 {ours.macro_f1:.3f} vs static threshold {base.macro_f1:.3f}")
    assert fired, "the baseline fires on the pinned pools"
    assert ours.macro_f1 > base.macro_f1 + 0.4
