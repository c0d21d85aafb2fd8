"""A fault-injecting HTTP proxy for tests: sits in front of a real Prometheus.

Stdlib only (``ThreadingHTTPServer`` in a daemon thread). Every request is
forwarded to ``upstream`` unless the current :class:`Fault` says otherwise.
A fault can be limited to paths containing a substring (``/query_range``) and
to the first ``times`` matching requests, so a test can break exactly one
query of a cycle. ``requests`` counts what reached the proxy.

    with FaultProxy(prom_url) as proxy:
        proxy.set(Fault(FaultMode.LATENCY, delay_s=3))
        ...  # point kvwatch at proxy.url
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit


class FaultMode(StrEnum):
    PASS = "pass"
    LATENCY = "latency"  # wait delay_s, then forward
    STATUS = "status"  # answer `status` with `body` (no upstream call)
    GARBAGE = "garbage"  # 200 with `body` (default: not JSON)
    TRUNCATE = "truncate"  # forward, then send only `fraction` of the body
    DROP = "drop"  # close the connection without an answer
    REWRITE = "rewrite"  # forward, parse JSON, apply `rewrite(doc)`, send the result


@dataclass(frozen=True)
class Fault:
    """What to do with matching requests.

    ``truncate_header``: for TRUNCATE, announce the full ``Content-Length`` (the
    client sees a short read) instead of the truncated length (the client sees
    a complete but cut-off JSON document).
    """

    mode: FaultMode = FaultMode.PASS
    delay_s: float = 0.0
    status: int = 500
    body: bytes = b"<html>oops</html>"
    fraction: float = 0.5
    truncate_header: bool = False
    rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    path_contains: str = ""
    times: int | None = None


class FaultProxy:
    """Context manager: start on 127.0.0.1 at a free port, forward to ``upstream``."""

    def __init__(self, upstream: str) -> None:
        u = urlsplit(upstream)
        self._host, self._port = u.hostname or "127.0.0.1", u.port or 80
        self._fault = Fault()
        self._applied = 0
        self._lock = threading.Lock()
        self.requests = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def set(self, fault: Fault) -> None:
        with self._lock:
            self._fault, self._applied = fault, 0

    def clear(self) -> None:
        self.set(Fault())

    def _pick(self, path: str) -> Fault:
        with self._lock:
            self.requests += 1
            f = self._fault
            if f.mode is FaultMode.PASS or f.path_contains not in path:
                return Fault()
            if f.times is not None and self._applied >= f.times:
                return Fault()
            self._applied += 1
            return f

    def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self._host, self._port, timeout=60)
        try:
            conn.request(method, path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            keep = [(k, v) for k, v in resp.getheaders() if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding")]
            return resp.status, keep, data
        finally:
            conn.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, headers: list[tuple[str, str]], body: bytes, length: int | None = None) -> None:
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()
                self.close_connection = True

            def _handle(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                fault = proxy._pick(self.path)
                mode = fault.mode
                if mode is FaultMode.DROP:
                    self.close_connection = True
                    self.connection.close()
                    return
                if mode is FaultMode.STATUS:
                    self._send(fault.status, [("Content-Type", "text/html")], fault.body)
                    return
                if mode is FaultMode.GARBAGE:
                    self._send(200, [("Content-Type", "application/json")], fault.body)
                    return
                if mode is FaultMode.LATENCY:
                    time.sleep(fault.delay_s)
                fwd = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection", "accept-encoding")}
                try:
                    status, headers, data = proxy._forward(self.command, self.path, fwd, body)
                except OSError as exc:  # upstream gone (stopped first at teardown): what a proxy answers
                    self._send(502, [("Content-Type", "text/plain")], f"bad gateway: {exc}".encode())
                    return
                if mode is FaultMode.TRUNCATE:
                    cut = data[: int(len(data) * fault.fraction)]
                    self._send(status, headers, cut, len(data) if fault.truncate_header else None)
                    return
                if mode is FaultMode.REWRITE and fault.rewrite is not None:
                    data = json.dumps(fault.rewrite(json.loads(data))).encode()
                self._send(status, headers, data)

            do_GET = _handle
            do_POST = _handle

        return Handler
