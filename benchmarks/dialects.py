"""Classification per dialect: every scenario preset x the chosen simulator dialects (full cross).

Each preset's label is checked by the simulator against its own ground truth; the corpus is
backfilled into a real Prometheus with promtool and evaluated once by the real pipeline.
Prints, per dialect, how many targets of each expected mode got which state, and the
accuracy over targets whose dialect exports what decides their mode (a blind spot where the
engine cannot show the signature is counted separately, not as a hit).

    python benchmarks/dialects.py [--dialects lmdeploy tgi ...] [--seeds 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

from kvwatch.config import load_settings
from kvwatch.core.pipeline import evaluate
from kvwatch.core.promclient import PromClient
from kvwatch.core.rules import load_ruleset
from kvwatch.sim.corpus import build_corpus
from kvwatch.sim.vocab import Dialect

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.prom import backfill, prometheus

NEW = ("lmdeploy", "tgi", "dynamo-frontend", "dynamo-worker", "vllm-ray", "sglang-ray")


def run(work: Path, dialects: list[str], seeds: int) -> dict[str, Counter[tuple[str, str]]]:
    doc = build_corpus(work, dialects=dialects, seeds=seeds, full_cross=True)
    bad = [t["name"] for t in doc["targets"] if not t["validation"]["ok"]]
    if bad:
        print(f"labels not confirmed by ground truth (left out): {len(bad)}", file=sys.stderr)
    backfill(work / "fleet.om", work / "tsdb")
    at = datetime.fromtimestamp(doc["end_unix"], tz=UTC)
    with prometheus(work / "tsdb") as url:
        ev = evaluate(PromClient(url, timeout_s=300), load_settings(None, environ={}), load_ruleset(), at)
    got = {r.target.key.instance: r.state.value for r in ev.results}
    out: dict[str, Counter[tuple[str, str]]] = defaultdict(Counter)
    for t in doc["targets"]:
        if t["name"] in bad:
            continue
        out[t["dialect"]][(t["expected"], got.get(t["instance"], "missing"))] += 1
    return out


def report(table: dict[str, Counter[tuple[str, str]]]) -> str:
    lines = []
    for dialect, pairs in sorted(table.items()):
        n = sum(pairs.values())
        hits = sum(c for (e, g), c in pairs.items() if e == g)
        unknown = sum(c for (e, g), c in pairs.items() if g == "unknown")
        modes = sorted({e for e, _ in pairs})
        lines.append(f"{dialect}: {hits}/{n} correct, {unknown} unknown; modes {', '.join(modes)}")
        for (e, g), c in sorted(pairs.items()):
            mark = "" if e == g else "   <-"
            lines.append(f"    {e:<12} -> {g:<12} {c}{mark}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dialects", nargs="+", default=list(NEW), choices=[d.value for d in Dialect])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--out", help="keep the corpus here (default: a temp dir, removed)")
    args = ap.parse_args(argv)
    work = Path(args.out or tempfile.mkdtemp(prefix="kvwatch-dialects-"))
    try:
        print(report(run(work, args.dialects, args.seeds)))
    finally:
        if not args.out:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
