"""The test helpers' server start-up: a lost port is retried on fresh ports, other failures show the log.

A port chosen by ``free_port()`` can be taken by another process before the server binds it
(an HA test's Alertmanager exited with 1 at start-up in CI that way). Reproduced here with a
real Prometheus whose port is already held by an impostor HTTP server answering 200 to
everything: the start must not take the impostor for a ready Prometheus, and must come up on
a fresh port.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from support.prom import (
    PROMETHEUS,
    PortClash,
    _ephemeral_low,
    free_port,
    on_free_ports,
    require_binary,
    server_process,
)

pytestmark = pytest.mark.prometheus


@contextmanager
def impostor() -> Iterator[int]:
    """An HTTP server answering 200 to every GET (a ready probe included); yields its port."""

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield int(srv.server_address[1])
    finally:
        srv.shutdown()
        srv.server_close()


def _prometheus(work: Path, config: str = "global:\n  scrape_interval: 15s\n") -> Callable[[int], Any]:
    binary = require_binary(PROMETHEUS)
    (work / "p.yml").write_text(config)

    @contextmanager
    def start(port: int) -> Iterator[str]:
        url = f"http://127.0.0.1:{port}"
        args = [binary, f"--config.file={work / 'p.yml'}", f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}"]
        with server_process(args, f"{url}/-/ready", work / "p.log", timeout=30):
            yield url

    return start


def test_a_server_that_lost_its_port_restarts_on_a_fresh_one() -> None:
    with tempfile.TemporaryDirectory() as d, impostor() as taken:
        start = _prometheus(Path(d))
        tried: list[int] = []

        def first_on_the_taken_port(ports: list[int]) -> Any:
            tried.append(taken if not tried else ports[0])
            return start(tried[-1])

        with on_free_ports(first_on_the_taken_port) as url:
            assert tried[0] == taken and len(tried) == 2, tried
            assert url == f"http://127.0.0.1:{tried[1]}"
            # the real Prometheus answers, not the impostor
            info = requests.get(f"{url}/api/v1/status/buildinfo", timeout=5).json()
            assert info["status"] == "success" and info["data"]["version"]


def test_a_lost_port_alone_is_reported_as_a_clash_with_the_log() -> None:
    with (tempfile.TemporaryDirectory() as d, impostor() as taken,
          pytest.raises(PortClash, match="address already in use"), _prometheus(Path(d))(taken)):
        pass


def test_any_other_early_exit_fails_at_once_with_the_servers_log() -> None:
    with tempfile.TemporaryDirectory() as d:
        start = _prometheus(Path(d), config="scrape_configs: [nonsense\n")
        tried: list[int] = []

        def counted(ports: list[int]) -> Any:
            tried.append(ports[0])
            return start(ports[0])

        with pytest.raises(RuntimeError) as err, on_free_ports(counted):
            pass
    assert not isinstance(err.value, PortClash)
    assert len(tried) == 1, "a configuration error is not retried"
    assert "exited with" in str(err.value) and "p.yml" in str(err.value), str(err.value)


def test_free_ports_are_distinct_and_outside_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(p < _ephemeral_low() for p in ports)
