"""``/metrics``, ``/healthz`` (process alive) and ``/readyz`` (last cycle succeeded recently).

Stdlib ``http.server`` in a daemon thread; metrics from the injected registry only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class HttpServer:
    def __init__(self, host: str, port: int, registry: CollectorRegistry, ready: Callable[[], bool]) -> None:
        handler = _handler(registry, ready)
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, name="kvwatch-http", daemon=True)

    def start(self) -> HttpServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(registry: CollectorRegistry, ready: Callable[[], bool]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # no access log: scrapes every few seconds
            pass

        def _send(self, status: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(200, b"ok\n")
            elif path == "/readyz":
                ok = ready()
                self._send(200 if ok else 503, b"ready\n" if ok else b"no successful cycle recently\n")
            else:
                self._send(404, b"not found: try /metrics, /healthz, /readyz\n")

    return Handler
