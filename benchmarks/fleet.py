"""Fleet-scale benchmark: one kvwatch evaluation cycle against a real Prometheus.

    python benchmarks/fleet.py                    # 100, 1000, 5000 targets
    python benchmarks/fleet.py --sizes 1000 --cycles 5

Per size: a synthetic fleet (``synth.py``: five dialects, real metric names,
40 min at 15 s) is backfilled with promtool into a cached TSDB
(``benchmarks/.cache``; reused on the next run), a real Prometheus serves it, and
``kvwatch.core.pipeline.evaluate`` runs at the last sample. Each size runs in a fresh
subprocess so peak RSS is per size. Printed per size: cycle wall time, HTTP wait
(summed over concurrent queries), Prometheus CPU, kvwatch CPU (whole process:
JSON parsing, grids, features, diagnosis), stage times, queries, bytes, peak RSS
and the tracemalloc peak of one extra cycle.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from promrun import backfill_fleet, cpu_seconds, run_prometheus  # noqa: E402

START_S = 1739995200  # aligned to a 2 h TSDB block so the 40 min land in one block
STEP_S = 15
SAMPLES = 40 * 60 // STEP_S + 1
GEN_VERSION = 3  # bump when synth.py changes what it writes


def ensure_tsdb(size: int, cache: Path, jobs: int) -> Path:
    tsdb = cache / f"tsdb-{size}-v{GEN_VERSION}"
    done = tsdb / ".complete"
    if done.exists():
        return tsdb
    if tsdb.exists():
        subprocess.run(["rm", "-rf", str(tsdb)], check=True)
    t0 = time.monotonic()
    n = backfill_fleet(tsdb, size, START_S, SAMPLES, STEP_S, jobs=jobs)
    done.write_text(json.dumps({"samples": n, "seconds": round(time.monotonic() - t0, 1)}))
    print(f"  backfilled {size} targets: {n / 1e6:.1f}M samples in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    return tsdb


def _cycle(client: Any, settings: Any, rules: Any, at: datetime, prom_pid: int, evaluator: Any = None) -> dict[str, float]:
    from kvwatch.core.pipeline import evaluate

    s = client.stats
    q0, b0, h0 = s.queries, s.bytes_received, s.http_seconds
    p0, c0, w0 = cpu_seconds(prom_pid), time.process_time(), time.perf_counter()
    ev = (evaluator or evaluate)(client, settings, rules, at)
    wall = time.perf_counter() - w0
    states: dict[str, int] = {}
    for r in ev.results:
        states[r.state.value] = states.get(r.state.value, 0) + 1
    return {
        "wall_s": wall,
        "kvwatch_cpu_s": time.process_time() - c0,
        "prom_cpu_s": cpu_seconds(prom_pid) - p0,
        "http_wait_s": s.http_seconds - h0,
        "queries": s.queries - q0,
        "mbytes": (s.bytes_received - b0) / 1e6,
        "targets": len(ev.results),
        "states": states,  # type: ignore[dict-item]
    }


def _stages(client: Any, settings: Any, rules: Any, at: datetime) -> dict[str, float]:
    """The pipeline's stages timed one by one (same calls as ``evaluate``)."""
    from kvwatch.core.collect import collect
    from kvwatch.core.diagnose import Params, diagnose
    from kvwatch.core.discover import discover
    from kvwatch.durations import format_duration

    ev = settings.evaluation
    t0 = time.perf_counter()
    targets = discover(client, at, ev.window, "", settings.discovery.dialects)
    t1 = time.perf_counter()
    data = collect(client, targets, at=at, window_s=ev.window, step_s=ev.step,
                   rate_window=format_duration(ev.rate_window), user_matchers="",
                   max_concurrency=settings.prometheus.max_concurrency)
    t2 = time.perf_counter()
    diagnose(targets, data, rules, Params(at=at.timestamp(), window_s=ev.window, step_s=ev.step, ttft_slo_s=ev.ttft_slo))
    t3 = time.perf_counter()
    return {"discover_s": t1 - t0, "collect_s": t2 - t1, "diagnose_s": t3 - t2}


def run_one(size: int, cache: Path, cycles: int, concurrency: int, jobs: int, step: str) -> dict[str, Any]:
    from kvwatch.config import load_settings
    from kvwatch.core.promclient import PromClient
    from kvwatch.core.rules import load_ruleset

    tsdb = ensure_tsdb(size, cache, jobs)
    at = datetime.fromtimestamp(START_S + STEP_S * (SAMPLES - 1), tz=UTC)
    rules = load_ruleset()
    with run_prometheus(tsdb) as (url, pid):
        settings = load_settings(None, environ={}, overrides={
            "prometheus": {"url": url, "timeout": "120s", "max_concurrency": concurrency},
            "evaluation": {"step": step}})
        client = PromClient(url, timeout_s=120, retries=0)
        _cycle(client, settings, rules, at, pid)  # warm-up: Prometheus maps the blocks
        runs = [_cycle(client, settings, rules, at, pid) for _ in range(cycles)]
        stages = _stages(client, settings, rules, at)
        tracemalloc.start()
        _cycle(client, settings, rules, at, pid)
        traced_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    out: dict[str, Any] = {"size": size}
    for key in ("wall_s", "kvwatch_cpu_s", "prom_cpu_s", "http_wait_s", "queries", "mbytes"):
        out[key] = statistics.median(r[key] for r in runs)
    out["targets"] = runs[-1]["targets"]
    out["states"] = runs[-1]["states"]
    out.update(stages)
    out["kvwatch_cpu_share"] = out["kvwatch_cpu_s"] / out["wall_s"]
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["tracemalloc_peak_mb"] = traced_peak / 1e6
    return out


STEADY_INTERVAL_S = 60
#: one more than ``discovery.refresh_cycles`` (10): the steady cycles include one rediscovery
#: (and re-measured probes), so the mean shows its amortised cost
STEADY_CYCLES = 10


def _recording_client(url: str) -> Any:
    """A ``PromClient`` that also keeps the text of every query it sends in ``.sent`` (to learn
    which metrics a steady cycle reads)."""
    from kvwatch.core.promclient import PromClient

    class Recording(PromClient):
        sent: list[str]

        def _raw(self, endpoint: str, params: dict[str, Any]) -> Any:
            self.sent.append(str(params.get("query", "")))
            return super()._raw(endpoint, params)

    client = Recording(url, timeout_s=120, retries=0)
    client.sent = []
    return client


def _metric_names(url: str, queries: list[str]) -> list[str]:
    """The metric names of ``url``'s Prometheus that ``queries`` mention."""
    import re

    import requests

    names = requests.get(f"{url}/api/v1/label/__name__/values", timeout=60).json()["data"]
    text = "\n".join(queries)
    return sorted(n for n in names if re.search(rf"(?<![\w:]){re.escape(n)}(?![\w:])", text))


def _floor_prom_cpu(url: str, pid: int, at: datetime, names: list[str], repeats: int = 3,
                    answer: bool = False) -> float:
    """Prometheus CPU seconds to read the newest minute of every series of ``names`` once (one
    instant query per metric; median of ``repeats``): what any cycle that looks at every series it
    monitors costs at least, whatever its queries (chunks decode whole).

    ``answer`` False counts the series (``count(last_over_time(…[1m]))``: nothing to encode);
    True returns one value per target, and per bucket for a ``_bucket`` metric
    (``sum by (job, instance[, le]) (last_over_time(…[1m]))``): the least any collection that
    receives per-target values over the HTTP API pays, one instant per metric."""
    import requests

    def query(n: str) -> str:
        sel = f'last_over_time({{__name__="{n}"}}[1m])'
        if not answer:
            return f"count({sel})"
        return f"sum by (job, instance{', le' if n.endswith('_bucket') else ''}) ({sel})"

    runs = []
    for _ in range(repeats):
        p0 = cpu_seconds(pid)
        for n in names:
            requests.get(f"{url}/api/v1/query", params={"query": query(n), "time": at.timestamp()},
                         timeout=120).raise_for_status()
        runs.append(cpu_seconds(pid) - p0)
    return statistics.median(runs)


def run_steady(size: int, cache: Path, concurrency: int, jobs: int, step: str) -> dict[str, Any]:
    """The service's steady state: one full first cycle, then incremental cycles every minute.

    Cycles run at START + 30 min, + 1 min, … (the cached TSDB holds 40 min), each
    instant aligned to the step as the service aligns it. Next to them, a full fetch
    (``pipeline.evaluate``) at the last instant, in the same Prometheus, and the floor: the
    Prometheus CPU of reading the newest minute of every series the steady cycles read, once
    (counted, and answered per target: :func:`_floor_prom_cpu`). The 1-minute load average
    before and after is recorded: wall times mean little on a loaded machine.
    """
    import gc
    import os

    from kvwatch.config import load_settings
    from kvwatch.core.promclient import PromClient
    from kvwatch.core.rules import load_ruleset
    from kvwatch.service.cycle import aligned
    from kvwatch.service.incremental import IncrementalEvaluator

    tsdb = ensure_tsdb(size, cache, jobs)
    rules = load_ruleset()
    first_at = START_S + 30 * 60
    with run_prometheus(tsdb) as (url, pid):
        settings = load_settings(None, environ={}, overrides={
            "prometheus": {"url": url, "timeout": "120s", "max_concurrency": concurrency},
            "evaluation": {"step": step}})
        client = PromClient(url, timeout_s=120, retries=0)
        _cycle(client, settings, rules, aligned(first_at - 300, settings.evaluation.step), pid)  # warm-up
        load_before = os.getloadavg()[0]
        inc = IncrementalEvaluator()
        ats = [aligned(first_at + i * STEADY_INTERVAL_S, settings.evaluation.step) for i in range(STEADY_CYCLES + 1)]
        first = _cycle(client, settings, rules, ats[0], pid, inc)
        steady, kinds = [], []
        recorder = _recording_client(url)
        for at in ats[1:]:
            steady.append(_cycle(recorder, settings, rules, at, pid, inc))
            kinds.append((inc.last_mode, inc.last_steps, inc.last_discovered))
        read = _metric_names(url, recorder.sent)
        floor = _floor_prom_cpu(url, pid, ats[-1], read)
        answer_floor = _floor_prom_cpu(url, pid, ats[-1], read, answer=True)
        full = [_cycle(client, settings, rules, ats[-1], pid) for _ in range(2)][-1]
        load_after = os.getloadavg()[0]
        # memory the service keeps between cycles: the window of every target
        gc.collect()
        tracemalloc.start()
        keep = IncrementalEvaluator()
        ev = keep(client, settings, rules, ats[-1])
        del ev
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        arrays = sum(a.nbytes for sigs in keep.data.series.values() for a in sigs.values()) if keep.data else 0
    keys = ("wall_s", "prom_cpu_s", "kvwatch_cpu_s", "queries", "mbytes")
    med = {k: statistics.median(r[k] for r in steady) for k in keys}
    mean = {k: statistics.fmean(r[k] for r in steady) for k in keys}
    return {
        "size": size, "targets": first["targets"], "first_wall_s": first["wall_s"], "first_prom_cpu_s": first["prom_cpu_s"],
        "steady_wall_s": med["wall_s"], "steady_wall_max_s": max(r["wall_s"] for r in steady),
        "steady_prom_cpu_s": med["prom_cpu_s"], "steady_kvwatch_cpu_s": med["kvwatch_cpu_s"],
        "steady_mean_wall_s": mean["wall_s"], "steady_mean_prom_cpu_s": mean["prom_cpu_s"],
        "steady_mean_kvwatch_cpu_s": mean["kvwatch_cpu_s"], "steady_max_prom_cpu_s": max(r["prom_cpu_s"] for r in steady),
        "per_cycle": [(round(r["wall_s"], 2), round(r["prom_cpu_s"], 2), round(r["kvwatch_cpu_s"], 2), r["queries"])
                      for r in steady],
        "load_before": load_before, "load_after": load_after,
        "steady_queries": med["queries"], "steady_mbytes": med["mbytes"],
        "prom_cpu_share": med["prom_cpu_s"] / first["prom_cpu_s"] if first["prom_cpu_s"] else float("nan"),
        "prom_cpu_share_mean": mean["prom_cpu_s"] / first["prom_cpu_s"] if first["prom_cpu_s"] else float("nan"),
        "floor_prom_cpu_s": floor, "floor_metrics": len(read),
        "floor_share": floor / first["prom_cpu_s"] if first["prom_cpu_s"] else float("nan"),
        "answer_floor_prom_cpu_s": answer_floor,
        "answer_floor_share": answer_floor / first["prom_cpu_s"] if first["prom_cpu_s"] else float("nan"),
        "full_wall_s": full["wall_s"], "full_prom_cpu_s": full["prom_cpu_s"], "full_queries": full["queries"],
        "kept_kb_per_target": kept / 1024 / max(1, first["targets"]),
        "arrays_kb_per_target": arrays / 1024 / max(1, first["targets"]),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cycles": kinds,
    }


def run_shards(size: int, counts: list[int], cache: Path, concurrency: int, jobs: int, step: str) -> dict[str, Any]:
    """The fleet evaluated whole and in N shards: coverage (union, duplicates) and each shard's cycle."""
    from kvwatch.config import load_settings
    from kvwatch.core.promclient import PromClient
    from kvwatch.core.rules import load_ruleset

    tsdb = ensure_tsdb(size, cache, jobs)
    rules = load_ruleset()
    at = datetime.fromtimestamp(START_S + STEP_S * (SAMPLES - 1), tz=UTC)
    out: dict[str, Any] = {"size": size, "runs": []}
    with run_prometheus(tsdb) as (url, pid):
        def settings_for(shard: dict[str, int]) -> Any:
            return load_settings(None, environ={}, overrides={
                "prometheus": {"url": url, "timeout": "120s", "max_concurrency": concurrency},
                "evaluation": {"step": step}, "shard": shard})

        def keys_and_cycle(shard: dict[str, int]) -> tuple[set[tuple[str, str]], dict[str, float]]:
            from kvwatch.core.pipeline import evaluate

            client = PromClient(url, timeout_s=120, retries=0)
            ev_keys: set[tuple[str, str]] = set()
            settings = settings_for(shard)
            r = _cycle(client, settings, rules, at, pid)
            ev_keys = {(x.target.key.job, x.target.key.instance) for x in evaluate(client, settings, rules, at).results}
            return ev_keys, r

        keys_and_cycle({})  # warm-up
        whole_keys, whole = keys_and_cycle({})
        out["whole"] = {"targets": len(whole_keys), "wall_s": whole["wall_s"], "prom_cpu_s": whole["prom_cpu_s"]}
        for n in counts:
            parts = [keys_and_cycle({"index": i, "count": n}) for i in range(n)]
            all_keys = [k for ks, _ in parts for k in ks]
            out["runs"].append({
                "count": n, "union_equals_fleet": set(all_keys) == whole_keys,
                "duplicates": len(all_keys) - len(set(all_keys)),
                "targets": [len(ks) for ks, _ in parts],
                "wall_s": [r["wall_s"] for _, r in parts], "prom_cpu_s": [r["prom_cpu_s"] for _, r in parts],
            })
    return out


def _table(rows: list[dict[str, Any]]) -> str:
    cols = [
        ("targets", "size", "{:d}"), ("found", "targets", "{:d}"), ("cycle s", "wall_s", "{:.2f}"),
        ("http wait s", "http_wait_s", "{:.2f}"), ("prom CPU s", "prom_cpu_s", "{:.2f}"),
        ("kvwatch CPU s", "kvwatch_cpu_s", "{:.2f}"), ("kvwatch CPU %", "kvwatch_cpu_share", "{:.0%}"),
        ("discover s", "discover_s", "{:.2f}"), ("collect s", "collect_s", "{:.2f}"),
        ("diagnose s", "diagnose_s", "{:.2f}"), ("queries", "queries", "{:.0f}"),
        ("MB recv", "mbytes", "{:.1f}"), ("peak RSS MB", "peak_rss_mb", "{:.0f}"),
        ("tracemalloc MB", "tracemalloc_peak_mb", "{:.0f}"),
    ]
    head = "| " + " | ".join(c[0] for c in cols) + " |"
    sep = "|" + "|".join("---:" for _ in cols) + "|"
    lines = [head, sep]
    for r in rows:
        lines.append("| " + " | ".join(fmt.format(r[key]) for _, key, fmt in cols) + " |")
    return "\n".join(lines)


def _steady_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| targets | first cycle s | first prom CPU s | steady cycle s (median / mean / max) | "
        "steady prom CPU s (median / mean / max) | prom CPU vs first (median / mean) | "
        "steady kvwatch CPU s (median / mean) | steady queries | steady MB | full-fetch cycle s | "
        "full prom CPU s | floor prom CPU s (vs first) | answer floor prom CPU s (vs first) | kept KB/target | peak RSS MB | load avg (before / after) |",
        "|" + "---:|" * 16,
    ]
    for r in rows:
        lines.append(
            f"| {r['size']} | {r['first_wall_s']:.2f} | {r['first_prom_cpu_s']:.2f} | "
            f"{r['steady_wall_s']:.2f} / {r['steady_mean_wall_s']:.2f} / {r['steady_wall_max_s']:.2f} | "
            f"{r['steady_prom_cpu_s']:.2f} / {r['steady_mean_prom_cpu_s']:.2f} / {r['steady_max_prom_cpu_s']:.2f} | "
            f"{r['prom_cpu_share']:.0%} / {r['prom_cpu_share_mean']:.0%} | "
            f"{r['steady_kvwatch_cpu_s']:.2f} / {r['steady_mean_kvwatch_cpu_s']:.2f} | {r['steady_queries']:.0f} | "
            f"{r['steady_mbytes']:.1f} | {r['full_wall_s']:.2f} | {r['full_prom_cpu_s']:.2f} | "
            f"{r['floor_prom_cpu_s']:.2f} ({r['floor_share']:.0%}) | "
            f"{r['answer_floor_prom_cpu_s']:.2f} ({r['answer_floor_share']:.0%}) | {r['kept_kb_per_target']:.1f} | {r['peak_rss_mb']:.0f} | "
            f"{r['load_before']:.1f} / {r['load_after']:.1f} |")
    return "\n".join(lines)


def _shard_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| targets | shards | union = fleet | duplicates | targets per shard | cycle s per shard | "
             "prom CPU s per shard | whole-fleet cycle s |", "|" + "---:|" * 8]
    for r in rows:
        for run in r["runs"]:
            lines.append(
                f"| {r['size']} | {run['count']} | {run['union_equals_fleet']} | {run['duplicates']} | "
                f"{', '.join(map(str, run['targets']))} | {', '.join(f'{x:.2f}' for x in run['wall_s'])} | "
                f"{', '.join(f'{x:.2f}' for x in run['prom_cpu_s'])} | {r['whole']['wall_s']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 5000])
    ap.add_argument("--cycles", type=int, default=3, help="measured cycles per size (median reported)")
    ap.add_argument("--concurrency", type=int, default=4, help="prometheus.max_concurrency")
    ap.add_argument("--jobs", type=int, default=2, help="parallel promtool backfills")
    ap.add_argument("--step", default="30s", help="evaluation.step (resolution of range queries)")
    ap.add_argument("--cache", type=Path, default=HERE / ".cache")
    ap.add_argument("--steady", action="store_true",
                    help="service steady state: a full first cycle, then incremental cycles every minute")
    ap.add_argument("--shards", type=int, nargs="+", metavar="N",
                    help="evaluate each size whole and in N shards (coverage and per-shard cycle)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child mode: one size, JSON out
    args = ap.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    if args.one and args.steady:
        print(json.dumps(run_steady(args.one, args.cache, args.concurrency, args.jobs, args.step)))
        return 0
    if args.one and args.shards:
        print(json.dumps(run_shards(args.one, args.shards, args.cache, args.concurrency, args.jobs, args.step)))
        return 0
    if args.one:
        print(json.dumps(run_one(args.one, args.cache, args.cycles, args.concurrency, args.jobs, args.step)))
        return 0
    rows = []
    for size in args.sizes:
        cmd = [sys.executable, __file__, "--one", str(size), "--cycles", str(args.cycles),
               "--concurrency", str(args.concurrency), "--jobs", str(args.jobs), "--cache", str(args.cache),
               "--step", args.step]
        if args.steady:
            cmd.append("--steady")
        if args.shards:
            cmd += ["--shards", *map(str, args.shards)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
        if res.returncode != 0:
            print(res.stderr[-3000:], file=sys.stderr)
            return 1
        sys.stderr.write(res.stderr)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(f"{size}: {json.dumps(rows[-1])}", file=sys.stderr)
    if args.steady:
        print(_steady_table(rows))
    elif args.shards:
        print(_shard_table(rows))
    else:
        print(_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
