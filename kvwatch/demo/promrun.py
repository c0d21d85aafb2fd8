"""A throwaway Prometheus for the demo: backfilled blocks, a loopback port, a temp dir.

Everything it starts is owned by a :class:`Scratch` and torn down in ``close()``:
the server process (terminated, then killed) and the temporary directory. The
child also asks the kernel to SIGTERM it when the demo dies without cleaning up
(Linux ``PR_SET_PDEATHSIG``), so not even ``kill -9`` of the demo leaves it running.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

import requests

#: temp dirs of the demo start with this (tests look for leftovers by it)
TEMP_PREFIX = "kvwatch-demo-"


def find_binaries() -> tuple[str, str] | None:
    """Paths of ``prometheus`` and ``promtool``, or None when either is missing."""
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    return (prom, tool) if prom and tool else None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Scratch:
    """Owns one temp dir and the processes started for the demo; ``close()`` is idempotent."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
        self._procs: list[subprocess.Popen[bytes]] = []
        self._files: list[IO[bytes]] = []

    def backfill(self, promtool: str, openmetrics: Path, tsdb: Path, timeout_s: float = 600) -> None:
        """``promtool tsdb create-blocks-from openmetrics``; raises RuntimeError with its stderr."""
        tsdb.mkdir(parents=True, exist_ok=True)
        proc = self._spawn([promtool, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(tsdb)],
                           self.dir / "promtool.log")
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"promtool backfill took longer than {timeout_s:.0f}s") from None
        if rc != 0:
            tail = (self.dir / "promtool.log").read_text(errors="replace")[-1500:]
            raise RuntimeError(f"promtool backfill failed (exit {rc}): {tail.strip()}")

    def prometheus(self, binary: str, tsdb: Path, timeout_s: float = 60) -> str:
        """Start Prometheus on a free loopback port over ``tsdb``; returns its base URL once ready."""
        cfg = self.dir / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1m\n")
        port = free_port()
        proc = self._spawn(
            [
                binary,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={tsdb}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=100y",
                "--log.level=warn",
            ],
            self.dir / "prometheus.log",
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = (self.dir / "prometheus.log").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"prometheus exited with {proc.returncode}: {tail.strip()}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    return url
            time.sleep(0.1)
        raise RuntimeError(f"prometheus at {url} not ready after {timeout_s:.0f}s")

    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        out = open(log, "wb")  # noqa: SIM115 - closed in close()
        self._files.append(out)
        # own session: a terminal Ctrl-C reaches only the demo, which then shuts the child down in order
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_die_with_parent)
        self._procs.append(proc)
        return proc

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def close(self) -> None:
        """Terminate every child (kill after 10 s), close logs, remove the temp dir."""
        for p in self._procs:
            if p.poll() is None:
                p.terminate()
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._procs.clear()
        for f in self._files:
            f.close()
        self._files.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
