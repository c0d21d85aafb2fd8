"""Fleet runs as OpenMetrics text with timestamps, for ``promtool tsdb create-blocks-from``.

Every sample carries ``job`` and ``instance``; families are contiguous and declared once;
counters use the OpenMetrics family name (without ``_total``) or, for engines whose
counters lack the suffix (Triton), type ``unknown`` so that the stored series keep the
engine's real names. Labels describing the scenario never go into the metrics: they are in
the JSON manifest.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from kvwatch.sim.expose import Family, Labels, escape, families, label_text
from kvwatch.sim.fleet import DEFAULT_PORT, TargetRun

DEFAULT_JOB = "kvwatch-sim"


@dataclass(frozen=True)
class OpenMetricsStats:
    path: Path
    families: int
    series: int
    samples: int


def _om_header(fam: Family) -> tuple[str, str]:
    """(OpenMetrics family name, type) of an engine family."""
    if fam.kind == "counter":
        if fam.name.endswith("_total"):
            return fam.name.removesuffix("_total"), "counter"
        return fam.name, "unknown"
    return fam.name, fam.kind


def _timestamps(run: TargetRun) -> list[str]:
    ts = np.round(run.wall_times, 3)
    return [str(int(t)) if t == int(t) else f"{t:.3f}" for t in ts.tolist()]


def _values(value: object, n: int) -> list[str]:
    arr = np.broadcast_to(np.asarray(value, dtype=float), (n,))
    return [repr(v) for v in arr.tolist()]


def _write_family(out: TextIO, fam: Family, target: Labels, ts: list[str]) -> tuple[int, int]:
    """Write one target's samples of ``fam``; returns (series, samples)."""
    n = len(ts)
    if fam.kind != "histogram":
        for s in fam.samples:
            prefix = f"{s.name}{label_text((*target, *s.labels))} "
            out.writelines(f"{prefix}{v} {t}\n" for v, t in zip(_values(s.value, n), ts,
                                                                 strict=True))
        return len(fam.samples), len(fam.samples) * n
    groups: dict[Labels, list[tuple[str, list[str]]]] = {}
    for s in fam.samples:  # one histogram per label set: its points are written together
        key = tuple(kv for kv in s.labels if kv[0] != "le")
        prefix = f"{s.name}{label_text((*target, *s.labels))} "
        groups.setdefault(key, []).append((prefix, _values(s.value, n)))
    for cols in groups.values():
        for i, t in enumerate(ts):
            out.writelines(f"{prefix}{vals[i]} {t}\n" for prefix, vals in cols)
    return len(fam.samples), len(fam.samples) * n


def write_openmetrics(runs: Sequence[TargetRun], path: str | Path, *, job: str = DEFAULT_JOB,
                      port: int = DEFAULT_PORT) -> OpenMetricsStats:
    """Write ``runs`` (their scrape series) to ``path``, ending with ``# EOF``."""
    per_name: dict[str, list[tuple[Family, Labels, list[str]]]] = {}
    for run in runs:
        target: Labels = (("instance", run.spec.instance(port)), ("job", job))
        ts = _timestamps(run)
        for fam in families(run.spec.dialect, run.views(), run.spec.model_name):
            per_name.setdefault(fam.name, []).append((fam, target, ts))
    path = Path(path)
    series = samples = 0
    with path.open("w", encoding="utf-8") as out:
        for members in per_name.values():
            name, kind = _om_header(members[0][0])
            help_ = escape(members[0][0].help)
            out.write(f"# TYPE {name} {kind}\n# HELP {name} {help_}\n")
            for fam, target, ts in members:
                n_series, n_samples = _write_family(out, fam, target, ts)
                series += n_series
                samples += n_samples
        out.write("# EOF\n")
    return OpenMetricsStats(path, len(per_name), series, samples)


class PromtoolError(RuntimeError):
    """promtool is missing or rejected the input."""


def backfill(openmetrics: str | Path, tsdb_dir: str | Path, *, promtool: str = "promtool"
             ) -> str:
    """``promtool tsdb create-blocks-from openmetrics FILE DIR``; returns promtool's output."""
    exe = shutil.which(promtool)
    if exe is None:
        raise PromtoolError(f"{promtool} not found on PATH")
    Path(tsdb_dir).mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([exe, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics),
                           str(tsdb_dir)], capture_output=True, text=True, timeout=600,
                          check=False)
    if proc.returncode != 0:
        raise PromtoolError(f"promtool failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.stdout + proc.stderr
