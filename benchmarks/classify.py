"""Classification quality on a randomized corpus, labelled by mechanism, every target scored.

Draws ``--targets`` engines per seed from wide simulator ranges (kvwatch.sim.randomized),
labels each from the simulator's ground truth (which limit binds), writes the base corpus
and, for a seeded ``--share`` of the targets, every perturbation (each optional signal
dropped per dialect, 30/60 s scrapes, scrape gaps, a counter reset, label churn) as its own
job, backfills all of it into a real Prometheus with promtool, evaluates once with the real
pipeline at the corpus end, and prints per-mode precision/recall/F1 and macro-F1 counting
every target (``unknown`` is a miss unless the target cannot export what decides it, see
kvwatch.sim.honest), per variant, healthy targets flagged, persistent-queue targets called
healthy, and the static ``min_over_time(kv[5m]) > 0.9`` alert on the same data.

    python benchmarks/classify.py [--targets 80] [--seeds 11 12] [--share 0.3] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from kvwatch.config import load_settings
from kvwatch.core.pipeline import evaluate
from kvwatch.core.promclient import PromClient
from kvwatch.core.quality import score, static_baseline_targets
from kvwatch.core.rules import load_ruleset
from kvwatch.sim import perturb
from kvwatch.sim.honest import HonestReport, score_corpus
from kvwatch.sim.randomized import build

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.prom import backfill, prometheus


def run(work: Path, *, targets: int, seeds: list[int], share: float, variants: tuple[perturb.Variant, ...],
        reuse: bool = False, rules: tuple[str, ...] = (), scrape_interval_s: float = 15.0) -> tuple[dict, HonestReport, set[tuple[str, str]], dict[str, float]]:
    """Build, backfill, evaluate and score; returns (manifest, report, static-alert keys, timings).
    ``reuse``: evaluate the corpus already in ``work`` (kept by an earlier ``--out``)."""
    t0 = time.monotonic()
    if reuse:
        doc = json.loads((work / "manifest.json").read_text())
        # a manifest written before a Variant field existed lacks it: its default applies
        names = [f.name for f in dataclasses.fields(perturb.Variant)]
        variants = tuple(perturb.Variant(**{k: v[k] for k in names if k in v}) for v in doc["variants"])
        t1 = t2 = time.monotonic()
    else:
        doc = build(work, n=targets, seeds=seeds, variants=variants, share=share,
                    scrape_interval_s=scrape_interval_s)
        t1 = time.monotonic()
        backfill(work / "fleet.om", work / "tsdb")
        (work / "fleet.om").unlink()
        t2 = time.monotonic()
    at = datetime.fromtimestamp(doc["end_unix"], tz=UTC)
    with prometheus(work / "tsdb") as url:
        client = PromClient(url, timeout_s=300)
        ev = evaluate(client, load_settings(None, environ={}), load_ruleset(rules), at)
        t3 = time.monotonic()
        fired = static_baseline_targets(client, at)
    results = {}
    for r in ev.results:
        p = r.primary
        results[(r.target.key.job, r.target.key.instance)] = (r.state.value, p.cause if p else None,
                                                              p.rule_id if p else "")
    rep = score_corpus(doc, results, variants)
    timing = {"simulate": t1 - t0, "backfill": t2 - t1, "evaluate": t3 - t2, "queries": float(ev.queries)}
    return doc, rep, fired, timing


def _baseline(rep: HonestReport, fired: set[tuple[str, str]], job: str) -> tuple[float, int, int, int]:
    """Static alert scored like kvwatch: fires → full, else healthy; (macro-F1, healthy flagged,
    failure targets it fires on, failure targets)."""
    pairs, flagged, caught, failing = [], 0, 0, 0
    for v in rep.verdicts:
        hit = (f"{job}-{v.variant}", v.instance) in fired
        exp = v.expected.split("/")[0]
        pairs.append((exp, "full" if hit else "healthy"))
        flagged += exp == "healthy" and hit
        if exp != "healthy":
            failing += 1
            caught += hit
    return score(pairs).macro_f1, flagged, caught, failing


def report(doc: dict, rep: HonestReport, fired: set[tuple[str, str]], timing: dict[str, float]) -> str:
    out: list[str] = []
    labels = Counter(v.expected for v in rep.verdicts if v.variant == "base")
    fams = Counter(t["family"] for t in doc["targets"])
    out.append(f"corpus: {len(doc['targets'])} drawn targets (seeds {doc['seeds']}), {len(rep.verdicts)} target-variants;"
               f" redrawn ambiguous: {sum(t['redrawn'] for t in doc['targets'])}")
    out.append("  labels: " + ", ".join(f"{k} {n}" for k, n in sorted(labels.items())))
    out.append("  families: " + ", ".join(f"{k} {n}" for k, n in sorted(fams.items())))
    out.append(f"  simulate+write {timing['simulate']:.0f}s, backfill {timing['backfill']:.0f}s,"
               f" one evaluation {timing['evaluate']:.1f}s ({timing['queries']:.0f} queries)")
    out.append("")
    overall = rep.modes()
    out.append("kvwatch, all variants (idle sub-causes folded):")
    out.append(overall.table())
    out.append(f"healthy targets flagged with a failure mode: {len(rep.healthy_flagged())}"
               f" (and called unknown: {len(rep.healthy_unknown())})")
    out.append(f"persistent-queue targets called healthy: {len(rep.queue_called_healthy())}")
    out.append(f"failure-mode targets called healthy: {len(rep.failure_called_healthy())}")
    out.append(f"abstentions (unknown, or all the dialect shows, where the target cannot export what decides it): "
               f"{len(rep.abstentions())}")
    out.append("")
    out.append(f"{'variant':<22} {'n':>4} {'macro-F1':>8} {'accuracy':>8} {'unknown':>7} {'healthy flagged':>15}"
               f" {'queue→healthy':>13} {'fail→healthy':>12} {'abstained':>9} {'base, same':>10}"
               f" {'changed':>7} {'→healthy':>8}")
    for vdoc in doc["variants"]:
        name = vdoc["name"]
        m = rep.modes(name)
        unknown = sum(1 for v in rep.scored(name) if v.got == "unknown")
        same, changed, to_healthy = rep.against_base(name)
        out.append(f"{name:<22} {m.total:>4} {m.macro_f1:>8.3f} {m.accuracy:>8.3f} {unknown:>7}"
                   f" {len(rep.healthy_flagged(name)):>15} {len(rep.queue_called_healthy(name)):>13}"
                   f" {len(rep.failure_called_healthy(name)):>12} {len(rep.abstentions(name)):>9}"
                   f" {same.macro_f1:>10.3f} {len(changed):>7} {len(to_healthy):>8}")
    out.append("(base, same: macro-F1 of the base verdicts on the targets scored in that variant, so a"
               " low figure with it is the draw, not the perturbation; changed / →healthy: verdicts"
               " that differ from the same target's base verdict)")
    out.append("")
    causes = rep.causes()
    out.append("idle sub-causes (expected → got):")
    for (e, g), n in sorted(causes.items()):
        out.append(f"  {e:<20} → {g:<20} {n}")
    out.append("")
    bf1, bflag, bcaught, bfail = _baseline(rep, fired, doc["job"])
    out.append("static `min_over_time(kv_usage[5m]) > 0.9` on the same target-variants (fires → full):")
    out.append(f"  macro-F1 {bf1:.3f}; fires on {bcaught}/{bfail} failure-mode targets and on {bflag} healthy ones")
    misses = rep.misses()
    if misses:
        out.append("")
        out.append(f"misclassified ({len(misses)}):")
        for v in sorted(misses, key=lambda v: (v.expected, v.variant, v.instance)):
            t = next(t for t in doc["targets"] if t["instance"] == v.instance)
            out.append(f"  {v.variant:<20} {v.instance:<36} expected {v.expected:<20} got {v.got:<20}"
                       f" {v.rule:<26} [{t['draw']}]")
    base = {v.instance: v.got for v in rep.verdicts if v.variant == "base"}
    changed = [v for vdoc in doc["variants"] if vdoc["name"] != "base" for v in rep.against_base(vdoc["name"])[1]]
    if changed:
        out.append("")
        out.append(f"verdicts changed by a perturbation ({len(changed)}; variant, target, expected: base → variant):")
        for v in changed:
            out.append(f"  {v.variant:<20} {v.instance:<36} {v.expected:<20} {base[v.instance]:<20} → {v.got:<20}"
                       f"{' (abstention)' if v.abstained else ''}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=80, help="targets drawn per seed")
    ap.add_argument("--seeds", type=int, nargs="+", default=[11, 12])
    ap.add_argument("--share", type=float, default=0.3, help="share of targets written under each perturbation")
    ap.add_argument("--base-only", action="store_true", help="no perturbed variants")
    ap.add_argument("--variants", nargs="+", metavar="NAME", choices=[v.name for v in perturb.ALL[1:]],
                    help="only these perturbed variants next to the base (default: all)")
    ap.add_argument("--scrape-interval", type=float, default=15.0, metavar="SECONDS",
                    help="the base variant's scrape interval (the same draws and labels; scrape-30s/-60s "
                         "keep every 2nd/4th of these scrapes, so use --base-only with another interval)")
    ap.add_argument("--out", help="keep the corpus and a JSON result here (default: a temp dir, removed)")
    ap.add_argument("--reuse", metavar="DIR", help="re-evaluate a corpus kept with --out (rules changed, data not)")
    ap.add_argument("--rules", nargs="+", default=[], help="rule files or directories (default: the bundled rules)")
    args = ap.parse_args(argv)
    if args.reuse:
        doc, rep, fired, timing = run(Path(args.reuse), targets=0, seeds=[], share=0, variants=(), reuse=True,
                                      rules=tuple(args.rules))
        print(report(doc, rep, fired, timing))
        return 0
    if args.base_only:
        variants: tuple[perturb.Variant, ...] = (perturb.BASE,)
    elif args.variants:
        variants = (perturb.BASE, *(v for v in perturb.ALL if v.name in args.variants))
    else:
        variants = perturb.ALL
    work = Path(args.out or tempfile.mkdtemp(prefix="kvwatch-rnd-"))
    try:
        doc, rep, fired, timing = run(work, targets=args.targets, seeds=args.seeds, share=args.share,
                                      variants=variants, rules=tuple(args.rules),
                                      scrape_interval_s=args.scrape_interval)
        print(report(doc, rep, fired, timing))
        if args.out:
            (work / "result.json").write_text(json.dumps({
                "macro_f1": rep.modes().macro_f1,
                "verdicts": [{**v.__dict__, "exempt": sorted(v.exempt)} for v in rep.verdicts],
            }, indent=1))
    finally:
        if not args.out:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
