"""Backfill and run a real Prometheus for the benchmarks (no pytest needed).

``backfill_fleet`` writes the synthetic fleet in shards and runs ``promtool tsdb
create-blocks-from openmetrics`` on them in parallel; ``run_prometheus`` starts
the server on a free loopback port and always terminates it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from synth import shards, write_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.prom import on_free_ports, server_process

SHARD_TARGETS = 250


def _one_shard(args: tuple[Path, int, int, int, int, int]) -> int:
    out, first, count, start_s, samples, step_s = args
    om = out.parent / f"shard-{first}.om"
    n = write_shard(om, first, count, start_s, samples, step_s)
    try:
        res = subprocess.run(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(out)],
            capture_output=True, text=True, timeout=1800, check=False,
        )
        if res.returncode != 0:
            raise RuntimeError(f"promtool failed on {om}: {res.stderr[-2000:]}")
    finally:
        om.unlink(missing_ok=True)
    return n


def backfill_fleet(tsdb: Path, targets: int, start_s: int, samples: int, step_s: int, jobs: int = 2) -> int:
    """Write + backfill ``targets`` targets into ``tsdb``; returns the number of samples."""
    tsdb.mkdir(parents=True, exist_ok=True)
    work = [(tsdb, a, c, start_s, samples, step_s) for a, c in shards(targets, max(1, -(-targets // SHARD_TARGETS)))]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return sum(pool.map(_one_shard, work))


@contextmanager
def run_prometheus(tsdb: Path, extra_args: tuple[str, ...] = ()) -> Iterator[tuple[str, int]]:
    """A real Prometheus on ``tsdb`` (loopback, free port); yields its URL and pid."""
    work = Path(tempfile.mkdtemp(prefix="kvwatch-bench-"))
    cfg = work / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 15s\n")

    @contextmanager
    def start(ports: list[int]) -> Iterator[tuple[str, int]]:
        url = f"http://127.0.0.1:{ports[0]}"
        args = ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tsdb}",
                f"--web.listen-address=127.0.0.1:{ports[0]}", "--storage.tsdb.retention.time=100y", *extra_args]
        with server_process(args, f"{url}/-/ready", work / "prometheus.log", timeout=120, stop_timeout=20) as proc:
            yield url, proc.pid

    try:
        with on_free_ports(start) as (url, pid):
            yield url, pid
    finally:
        shutil.rmtree(work, ignore_errors=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
