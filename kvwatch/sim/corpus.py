"""Labelled scenario corpus: presets x dialects x seeds, as OpenMetrics + a JSON manifest."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvwatch.sim.fleet import DEFAULT_PORT, TargetRun, TargetSpec, make_targets, simulate
from kvwatch.sim.openmetrics import DEFAULT_JOB, write_openmetrics
from kvwatch.sim.scenarios import PRESETS
from kvwatch.sim.validate import (
    RECENT_S,
    TTFT_SLO_S,
    WINDOW_S,
    Validation,
    validate,
    validate_group,
)
from kvwatch.sim.vocab import Dialect

MANIFEST_SCHEMA = "kvwatch.sim/manifest-v1"


def default_end_time(now: float | None = None, lag_s: float = 3600.0) -> float:
    """A past end instant (epoch s): ``lag_s`` ago, floored to the minute."""
    return float(int(((now or time.time()) - lag_s) // 60) * 60)


def plan(presets: Sequence[str] | None = None, dialects: Sequence[Dialect | str] | None = None,
         seeds: int | Sequence[int] = 4, *, run_s: float | None, full_cross: bool = False
         ) -> list[TargetSpec]:
    """Targets of a corpus. Each (preset, seed) gets one dialect, rotating through
    ``dialects`` (``full_cross``: every dialect); vLLM 0.33 targets on odd seeds run two
    data-parallel engines."""
    names = list(presets or PRESETS)
    dials = [Dialect(d) for d in (dialects or list(Dialect))]
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    specs: list[TargetSpec] = []
    for s_i, seed in enumerate(seed_list):
        for p_i, preset in enumerate(names):
            chosen = dials if full_cross else [dials[(p_i + 3 * s_i) % len(dials)]]
            for d in chosen:
                dp = 2 if d is Dialect.VLLM_0_33 and seed % 2 else 1
                specs.extend(make_targets(preset, d, seed, run_s=run_s, data_parallel=dp))
    return specs


def _simulate_one(job: tuple[TargetSpec, float, float, float, float]
                  ) -> tuple[TargetRun, Validation]:
    spec, duration_s, end_time, warmup_s, interval = job
    run = simulate(spec, duration_s=duration_s, end_time=end_time, warmup_s=warmup_s,
                   scrape_interval_s=interval)
    return run, validate(run)


def run_fleet(specs: Sequence[TargetSpec], *, duration_s: float, end_time: float,
              warmup_s: float = 300.0, scrape_interval_s: float = 15.0,
              workers: int | None = None) -> list[tuple[TargetRun, Validation]]:
    """Simulate and validate every target (in ``workers`` processes; default: CPUs, max 4)."""
    jobs = [(s, duration_s, end_time, warmup_s, scrape_interval_s) for s in specs]
    workers = workers or min(4, os.cpu_count() or 1)
    if workers <= 1 or len(jobs) < 4:
        return [_simulate_one(j) for j in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_simulate_one, jobs, chunksize=2))


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def manifest(results: Sequence[tuple[TargetRun, Validation]], *, job: str, port: int,
             duration_s: float, warmup_s: float, scrape_interval_s: float, end_time: float
             ) -> dict[str, Any]:
    """JSON-able manifest: one entry per target (labels, dialect, preset, seed, expected
    mode/cause, group, engine config, ground-truth validation) plus the groups."""
    targets, groups = [], {}
    for run, val in results:
        spec, cfg = run.spec, run.spec.config
        targets.append({
            "name": spec.name, "instance": spec.instance(port), "job": job,
            "labels": {"instance": spec.instance(port), "job": job},
            "dialect": spec.dialect.value, "engine": spec.dialect.engine,
            "preset": spec.preset, "seed": spec.seed,
            "expected": spec.expected.value, "cause": spec.cause.value if spec.cause else None,
            "group": spec.group,
            "group_expected": spec.group_expected.value if spec.group_expected else None,
            "model_name": spec.model_name, "data_parallel": spec.data_parallel,
            "restart_at_s": spec.restart_at_s,
            "engine_config": {**asdict(cfg), "kv_cache_tokens": cfg.kv_tokens},
            "validation": val.as_dict(),
        })
        if spec.group:
            groups.setdefault(spec.group, {"name": spec.group, "expected": spec.group_expected,
                                           "members": [], "_vals": []})
            groups[spec.group]["members"].append(spec.instance(port))
            groups[spec.group]["_vals"].append(val)
    group_list = [{"name": g["name"], "expected": g["expected"].value, "members": g["members"],
                   "validated": validate_group(g.pop("_vals"))} for g in groups.values()]
    return {
        "schema": MANIFEST_SCHEMA, "job": job, "scrape_interval_s": scrape_interval_s,
        "start": _iso(end_time - duration_s), "end": _iso(end_time),
        "start_unix": end_time - duration_s, "end_unix": end_time, "duration_s": duration_s,
        "warmup_s": warmup_s,
        "oracle": {"window_s": WINDOW_S, "recent_s": RECENT_S, "ttft_slo_s": TTFT_SLO_S},
        "targets": targets, "groups": group_list,
    }


def build_corpus(out_dir: str | Path, *, presets: Sequence[str] | None = None,
                 dialects: Sequence[Dialect | str] | None = None,
                 seeds: int | Sequence[int] = 4, duration_s: float = 2400.0,
                 warmup_s: float = 300.0, scrape_interval_s: float = 15.0,
                 end_time: float | None = None, job: str = DEFAULT_JOB,
                 port: int = DEFAULT_PORT, full_cross: bool = False,
                 workers: int | None = None) -> dict[str, Any]:
    """Simulate a corpus; write ``fleet.om`` and ``manifest.json`` into ``out_dir``.

    Returns the manifest (also written), with ``openmetrics`` and ``stats`` added.
    """
    end_time = default_end_time() if end_time is None else float(end_time)
    specs = plan(presets, dialects, seeds, run_s=warmup_s + duration_s, full_cross=full_cross)
    results = run_fleet(specs, duration_s=duration_s, end_time=end_time, warmup_s=warmup_s,
                        scrape_interval_s=scrape_interval_s, workers=workers)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stats = write_openmetrics([r for r, _ in results], out / "fleet.om", job=job, port=port)
    doc = manifest(results, job=job, port=port, duration_s=duration_s, warmup_s=warmup_s,
                   scrape_interval_s=scrape_interval_s, end_time=end_time)
    doc["openmetrics"] = "fleet.om"
    doc["stats"] = {"families": stats.families, "series": stats.series,
                    "samples": stats.samples}
    (out / "manifest.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return doc
