"""Real Prometheus / Alertmanager processes for tests.

``require_binary`` fails (not skips) when ``CI`` is set, so CI can never pass
by skipping the tests that talk to real servers.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

PROMETHEUS = os.environ.get("KVWATCH_TEST_PROMETHEUS", "prometheus")
PROMTOOL = os.environ.get("KVWATCH_TEST_PROMTOOL", "promtool")
ALERTMANAGER_CANDIDATES = ("prometheus-alertmanager", "alertmanager")


def require_binary(*names: str) -> str:
    """Path of the first binary found; ``pytest.fail`` under CI, else skip."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    unavailable(f"{' or '.join(names)} not on PATH (install the Debian package; .ci/run does)")
    raise AssertionError("unreachable")


def unavailable(msg: str) -> None:
    """A test prerequisite is missing: fail under CI (a skip proves nothing there), skip locally."""
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)  # only outside CI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout}s")


def backfill(om_text: str | Path, tsdb: Path) -> None:
    """Create TSDB blocks from OpenMetrics text (must end with ``# EOF``) with real promtool."""
    promtool = require_binary(PROMTOOL)
    tsdb.mkdir(parents=True, exist_ok=True)
    if isinstance(om_text, Path):
        src = om_text
    else:
        src = tsdb.parent / "backfill.om"
        src.write_text(om_text)
    res = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(src), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if res.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {res.stderr.strip()[:2000]}")


@contextmanager
def server_process(
    args: list[str], ready_url: str, log_path: Path, timeout: float = 60.0, stop_timeout: float = 10.0
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a server binary until ``ready_url`` answers 200; always terminate it (then kill)."""
    log = open(log_path, "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(ready_url, timeout=timeout, proc=proc)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextmanager
def prometheus(
    tsdb: Path | None = None, config: str = "global:\n  scrape_interval: 15s\n", extra_args: tuple[str, ...] = ()
) -> Iterator[str]:
    """Run a real Prometheus on a free loopback port; yields its base URL."""
    binary = require_binary(PROMETHEUS)
    work = Path(tempfile.mkdtemp(prefix="kvwatch-prom-"))
    tsdb = tsdb or work / "data"
    cfg = work / "prometheus.yml"
    cfg.write_text(config)
    port = free_port()
    args = [
        binary,
        f"--config.file={cfg}",
        f"--storage.tsdb.path={tsdb}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=100y",
        "--query.lookback-delta=5m",
        "--web.enable-lifecycle",
        *extra_args,
    ]
    url = f"http://127.0.0.1:{port}"
    try:
        with server_process(args, f"{url}/-/ready", work / "prometheus.log"):
            yield url
    finally:
        shutil.rmtree(work, ignore_errors=True)
