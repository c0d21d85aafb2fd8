"""A local fake of the Slack Web API and of incoming webhooks, for the real ``slack_sdk``.

Implements ``chat.postMessage``, ``chat.update``, ``files.getUploadURLExternal``,
the upload URL, ``files.completeUploadExternal``, ``files.info`` and a webhook
path (``/webhook/...``). Records every request with its arrival time (monotonic).
``fail_next(n, status, retry_after)`` answers the next ``n`` calls with an error.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl


@dataclass
class Call:
    method: str  # "chat.postMessage", "webhook", "upload", ...
    body: dict[str, Any]
    at: float
    status: int
    headers: dict[str, str] = field(default_factory=dict)


class FakeSlack:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}  # (channel, ts) → latest message
        self._fail: list[tuple[int, float | None]] = []
        self._lock = threading.Lock()
        self._ts = 1_700_000_000
        self.url = ""
        self.uploads: dict[str, int] = {}

    # ---- test controls -------------------------------------------------------------------------
    def fail_next(self, n: int, status: int = 500, retry_after: float | None = None) -> None:
        with self._lock:
            self._fail.extend([(status, retry_after)] * n)

    def of(self, method: str, ok_only: bool = True) -> list[Call]:
        return [c for c in self.calls if c.method == method and (c.status == 200 or not ok_only)]

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/"

    @property
    def webhook_url(self) -> str:
        return f"{self.url}/webhook/T000/B000/XXXX"

    # ---- request handling ----------------------------------------------------------------------
    def handle(self, method: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        with self._lock:
            failure = self._fail.pop(0) if self._fail else None
            if failure is not None:
                status, retry = failure
                self.calls.append(Call(method, body, time.monotonic(), status, headers))
                extra = {"Retry-After": str(int(retry))} if retry is not None else {}
                return status, extra, {"ok": False, "error": "ratelimited" if status == 429 else "fatal_error"}
            self.calls.append(Call(method, body, time.monotonic(), 200, headers))
            return 200, {}, self._answer(method, body)

    def _answer(self, method: str, body: dict[str, Any]) -> Any:
        if method == "webhook":
            return "ok"
        if method == "chat.postMessage":
            self._ts += 1
            ts = f"{self._ts}.000100"
            channel = body.get("channel", "")
            self.messages[(channel, ts)] = dict(body)
            return {"ok": True, "channel": channel, "ts": ts, "message": {"text": body.get("text", "")}}
        if method == "chat.update":
            key = (body.get("channel", ""), body.get("ts", ""))
            if key not in self.messages:
                return {"ok": False, "error": "message_not_found"}
            self.messages[key] = {**self.messages[key], **body}
            return {"ok": True, "channel": key[0], "ts": key[1]}
        if method == "files.getUploadURLExternal":
            fid = f"F{len(self.uploads) + 1:04d}"
            self.uploads[fid] = 0
            return {"ok": True, "file_id": fid, "upload_url": f"{self.url}/upload/{fid}"}
        if method == "upload":
            return "OK - 0"
        if method == "files.completeUploadExternal":
            files = body.get("files")
            files = json.loads(files) if isinstance(files, str) else files or []
            return {"ok": True, "files": [{"id": f["id"], "title": f.get("title", "")} for f in files]}
        if method == "files.info":
            return {"ok": True, "file": {"id": body.get("file", "")}}
        return {"ok": False, "error": "unknown_method"}

    def _record_upload(self, fid: str, size: int) -> None:
        with self._lock:
            self.uploads[fid] = size


def _handler(fake: FakeSlack) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            ctype = self.headers.get("Content-Type", "")
            path = self.path.split("?", 1)[0]
            body: dict[str, Any] = {}
            if path.startswith("/upload/"):
                method = "upload"
                fake._record_upload(path.rsplit("/", 1)[1], len(raw))
                body = {"file_id": path.rsplit("/", 1)[1], "size": len(raw)}
            else:
                if "json" in ctype:
                    body = json.loads(raw or b"{}")
                else:
                    body = dict(parse_qsl(raw.decode()))
                if "?" in self.path:
                    body.update(dict(parse_qsl(self.path.split("?", 1)[1])))
                method = "webhook" if path.startswith("/webhook/") else path.removeprefix("/api/")
            status, extra, answer = fake.handle(method, body, {k.lower(): v for k, v in self.headers.items()})
            data = answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(answer, str) else "application/json")
            for k, v in extra.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST

    return H


@contextmanager
def fake_slack() -> Iterator[FakeSlack]:
    """Serve a :class:`FakeSlack` on a free loopback port for the duration of the block."""
    fake = FakeSlack()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
