"""A real VictoriaMetrics single-node process for tests, and an importer for OpenMetrics test data.

``victoriametrics()`` fails (not skips) under CI when the binary is missing, like
the Prometheus helpers. Data goes in through ``/api/v1/import/prometheus``: the
OpenMetrics text the tests backfill into Prometheus, with its second-resolution
timestamps turned into milliseconds, so both stores hold the same samples.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from support.prom import on_free_ports, require_binary, server_process

VICTORIA = ("victoria-metrics", "victoria-metrics-prod")


@contextmanager
def victoriametrics() -> Iterator[str]:
    """Run VictoriaMetrics on a free loopback port (result cache off); yields its base URL."""
    binary = require_binary(*VICTORIA)
    work = Path(tempfile.mkdtemp(prefix="kvwatch-vm-"))

    @contextmanager
    def start(ports: list[int]) -> Iterator[str]:
        url = f"http://127.0.0.1:{ports[0]}"
        args = [binary, f"-storageDataPath={work / 'data'}", f"-httpListenAddr=127.0.0.1:{ports[0]}",
                "-retentionPeriod=100y", "-search.disableCache"]
        with server_process(args, f"{url}/health", work / "vm.log"):
            yield url

    try:
        with on_free_ports(start) as url:
            yield url
    finally:
        shutil.rmtree(work, ignore_errors=True)


def import_openmetrics(url: str, om: str | Path, batch_lines: int = 200_000) -> int:
    """Import OpenMetrics text (``name{labels} value ts_seconds`` lines) into VictoriaMetrics.

    Returns the number of samples sent. Comments and ``# EOF`` are dropped; the data
    is flushed so that queries see it at once.
    """
    text = om.read_text() if isinstance(om, Path) else om
    batch: list[str] = []
    sent = 0

    def flush() -> None:
        if batch:
            resp = requests.post(f"{url}/api/v1/import/prometheus", data="\n".join(batch).encode(), timeout=300)
            resp.raise_for_status()
            batch.clear()

    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, ts = line.rsplit(" ", 1)
        batch.append(f"{head} {round(float(ts) * 1000)}")
        sent += 1
        if len(batch) >= batch_lines:
            flush()
    flush()
    requests.get(f"{url}/internal/force_flush", timeout=60).raise_for_status()
    return sent
