"""Benchmark ``kvwatch backtest``: N targets × H hours of vLLM history in a real Prometheus, 1 min steps.

    python benchmarks/backtest_bench.py [--targets 200] [--hours 6] [--step 60] [--scrape 30]

Builds the history with :mod:`kvwatch.tools.backtest.synth` (a quarter of the targets
go full for 40 min at staggered times, an eighth idle, the rest healthy-busy),
backfills it with promtool into a throw-away Prometheus on loopback, then times
one backtest (discovery + fetch + replay) and prints seconds, queries issued,
bytes received, history size and peak RSS of this process (Prometheus excluded).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.prom import backfill, prometheus

from kvwatch.config import load_settings
from kvwatch.core.promclient import PromClient
from kvwatch.core.rules import load_ruleset
from kvwatch.tools.backtest.replay import run_backtest
from kvwatch.tools.backtest.synth import SynthTarget, write_openmetrics

HOUR = 3600.0


def fleet(n: int, hours: float) -> list[SynthTarget]:
    span = hours * HOUR + 1800
    out = []
    for i in range(n):
        if i % 4 == 0:  # full for 40 min, staggered over the span
            at = 1800 + (i * 997) % max(1.0, span - 1800 - 2400)
            sched = ((at, "healthy-busy"), (2400.0, "full"), (span - at - 2400, "healthy-busy"))
        elif i % 8 == 1:
            sched = ((span, "idle"),)
        else:
            sched = ((span, "healthy-busy"),)
        out.append(SynthTarget(f"pod-{i:03d}:8000", sched, seed=i))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=200)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--step", type=float, default=60.0, help="backtest step, seconds")
    ap.add_argument("--scrape", type=float, default=30.0, help="sample interval of the history, seconds")
    a = ap.parse_args()
    d0 = 1_780_000_000 - 1_780_000_000 % 3600
    t0, t1 = d0 + 1800, d0 + 1800 + a.hours * HOUR
    with tempfile.TemporaryDirectory(prefix="kvwatch-bt-bench-") as tmp:
        work = Path(tmp)
        clock = time.perf_counter()
        om = write_openmetrics(work / "h.om", fleet(a.targets, a.hours), d0, t1, a.scrape)
        gen_s = time.perf_counter() - clock
        clock = time.perf_counter()
        backfill(om, work / "tsdb")
        fill_s = time.perf_counter() - clock
        om.unlink()
        with prometheus(tsdb=work / "tsdb") as url:
            settings = load_settings(None, environ={}, overrides={"prometheus": {"url": url, "timeout": "120s"}})
            client = PromClient(url, timeout_s=120)
            rules = load_ruleset()
            rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            clock = time.perf_counter()
            res = run_backtest(client, settings, rules, datetime.fromtimestamp(t0, UTC),
                               datetime.fromtimestamp(t1, UTC), a.step)
            run_s = time.perf_counter() - clock
            rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    hist = res.history
    hist_bytes = 0 if hist is None else sum(v.nbytes for s in hist.series.values() for v in s.values())
    incidents = sum(len(tl.incidents) for tl in res.timelines)
    print(f"history: {a.targets} targets x {a.hours:g} h (+30 min window), samples every {a.scrape:g}s "
          f"(generated in {gen_s:.1f}s, backfilled in {fill_s:.1f}s)")
    print(f"backtest: {len(res.steps)} steps of {a.step:g}s x {len(res.timelines)} targets "
          f"= {len(res.steps) * len(res.timelines)} target evaluations")
    print(f"seconds: {run_s:.1f} ({run_s / max(1, len(res.steps)) * 1000:.0f} ms per step)")
    print(f"queries: {client.stats.queries} ({client.stats.bytes_received / 1e6:.1f} MB received, "
          f"{client.stats.errors} errors)")
    print(f"memory: history arrays {hist_bytes / 1e6:.1f} MB; peak RSS {rss1 / 1024:.0f} MB "
          f"(before the backtest {rss0 / 1024:.0f} MB)")
    print(f"incidents: {incidents}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
