"""Real Prometheus / Alertmanager processes for tests.

``require_binary`` fails (not skips) when ``CI`` is set, so CI can never pass
by skipping the tests that talk to real servers. Servers start through
:func:`on_free_ports` + :func:`server_process`: a start-up that lost its port to
another process is retried on fresh ports; any other early exit fails with the
server's log.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
import requests

PROMETHEUS = os.environ.get("KVWATCH_TEST_PROMETHEUS", "prometheus")
PROMTOOL = os.environ.get("KVWATCH_TEST_PROMTOOL", "promtool")
ALERTMANAGER_CANDIDATES = ("prometheus-alertmanager", "alertmanager")
T = TypeVar("T")


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


class PortClash(RuntimeError):
    """A server exited at start-up because its port was taken (EADDRINUSE): retry on fresh ports."""


_BIND_ERRORS = ("address already in use", "eaddrinuse")
_issued: set[int] = set()  # never hand out a port twice in this process (it may not be bound yet)
_rng = random.SystemRandom()  # not the global generator: tests seed that, and parallel runs would pick alike


def _ephemeral_low() -> int:
    """Lowest port of the kernel's ephemeral range (bind(0) and outgoing connections draw from it)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    """True if both a TCP and a UDP socket can bind 127.0.0.1:port now (gossip listens on both)."""
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_port() -> int:
    """A loopback port free for TCP and UDP now, below the ephemeral range, never returned twice here.

    Why not ``bind(0)``: the kernel hands such a port out again to the next ``bind(0)`` and as the
    source port of any outgoing connection, so it can be taken before the server binds it. A random
    port under the ephemeral range is only at risk from another process choosing the same one;
    :func:`on_free_ports` retries a start-up that lost its port anyway.
    """
    low = _ephemeral_low()
    if low - 10000 >= 1000:
        for _ in range(200):
            port = _rng.randrange(10000, low)
            if port not in _issued and _bindable(port):
                _issued.add(port)
                return port
    while True:  # no room below the ephemeral range: the kernel's choice
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _issued:
            _issued.add(port)
            return port


def _listener_is_ours(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds the socket listening on ``port``; None if /proc cannot tell.

    A ready probe answered by a server that took the port first (before ours failed to bind) must
    not count as our server being ready.
    """
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            if table.endswith("6"):
                continue  # no IPv6
            return None
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f[9])
    if not inodes:
        return False
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return None
    links = {f"socket:[{i}]" for i in inodes}
    for fd in fds:
        try:
            if os.readlink(fd) in links:
                return True
        except OSError:
            continue
    return False


def _log_tail(log_path: Path | None, limit: int = 3000) -> str:
    if log_path is None:
        return ""
    try:
        return log_path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None,
              log_path: Path | None = None, **get_kwargs: Any) -> None:
    """Poll ``url`` until it answers 200 (``get_kwargs`` go to ``requests.get``: TLS, auth).

    With ``proc``: fail as soon as it exits (:class:`PortClash` if its log reports a bind error,
    else RuntimeError with the log's tail), and the answer must come from ``proc``'s own listener.
    """
    deadline = time.monotonic() + timeout
    port = urlsplit(url).port
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = _log_tail(log_path)
            kind = PortClash if any(e in tail.lower() for e in _BIND_ERRORS) else RuntimeError
            raise kind(f"process for {url} exited with {proc.returncode}; its log ends:\n{tail}")
        try:
            if requests.get(url, timeout=1, **get_kwargs).status_code == 200 and (
                    proc is None or port is None or _listener_is_ours(proc.pid, port) is not False):
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout}s; its log ends:\n{_log_tail(log_path)}")


@contextmanager
def on_free_ports(start: Callable[[list[int]], AbstractContextManager[T]], n: int = 1,
                  attempts: int = 5) -> Iterator[T]:
    """Enter ``start(ports)`` with ``n`` distinct fresh ports; on :class:`PortClash`, again with new ones.

    Only the start-up is retried: an error in the ``with`` body propagates as is.
    """
    for attempt in range(1, attempts + 1):
        stack = ExitStack()
        try:
            value = stack.enter_context(start([free_port() for _ in range(n)]))
        except PortClash:
            stack.close()
            if attempt == attempts:
                raise
            continue
        with stack:
            yield value
        return


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
    args: list[str], ready_url: str, log_path: Path, timeout: float = 60.0, stop_timeout: float = 10.0,
    **ready_kwargs: Any,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a server binary until ``ready_url`` answers 200 from it; always terminate it (then kill).

    Raises :class:`PortClash` if it exits at start-up on a bind error (see :func:`on_free_ports`),
    RuntimeError/TimeoutError with the tail of its log otherwise.
    """
    log = open(log_path, "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(ready_url, timeout=timeout, proc=proc, log_path=log_path, **ready_kwargs)
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

    @contextmanager
    def start(ports: list[int]) -> Iterator[str]:
        args = [
            binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tsdb}",
            f"--web.listen-address=127.0.0.1:{ports[0]}",
            "--storage.tsdb.retention.time=100y",
            "--query.lookback-delta=5m",
            "--web.enable-lifecycle",
            *extra_args,
        ]
        url = f"http://127.0.0.1:{ports[0]}"
        with server_process(args, f"{url}/-/ready", work / "prometheus.log"):
            yield url

    try:
        with on_free_ports(start) as url:
            yield url
    finally:
        shutil.rmtree(work, ignore_errors=True)


def kvwatch_port(log_path: Path, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """The port a ``kvwatch run --listen HOST:0`` announced in its log ("serving /metrics on HOST:PORT").

    Port 0 lets the kernel pick at bind time, so no port can be lost between choosing and binding.
    """
    deadline = time.monotonic() + timeout
    while True:
        m = re.search(r"serving /metrics on [^\s:]+:(\d+)", _log_tail(log_path, 100_000))
        if m:
            return int(m.group(1))
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"kvwatch announced no port (rc {proc.poll()}); its log ends:\n{_log_tail(log_path)}")
        time.sleep(0.1)
