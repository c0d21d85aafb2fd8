"""A local fake of the Slack Web API and of incoming webhooks, for the real ``slack_sdk``.

Implements ``chat.postMessage``, ``chat.update`` (both keep message ``metadata``),
``conversations.history`` (newest first, ``oldest``, metadata only with
``include_all_metadata``), ``conversations.list``, ``files.getUploadURLExternal``,
the upload URL, ``files.completeUploadExternal``, ``files.info`` and a webhook
path (``/webhook/...``). Records every request with its arrival time (monotonic).
``fail_next(n, status, retry_after, error, method)`` answers the next ``n`` calls with an error;
``hook(method, phase, body)`` is called ``"before"`` a call is processed and ``"after"`` it was
(before the answer is sent): the crash tests kill kvwatch there.

Messages are checked against Slack's Block Kit limits (:func:`block_errors`, written
independently of kvwatch's own clipping) and refused like Slack refuses them:
``{"ok": false, "error": "invalid_blocks"}`` from the Web API, HTTP 400
``invalid_blocks`` from a webhook. Refused calls are recorded with status 400.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
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


def _text_obj(obj: Any, where: str, limit: int, kinds: tuple[str, ...] = ("plain_text", "mrkdwn")) -> list[str]:
    if not isinstance(obj, dict) or obj.get("type") not in kinds:
        return [f"{where}: expected a text object of type {'/'.join(kinds)}"]
    text = obj.get("text")
    if not isinstance(text, str) or not text:
        return [f"{where}.text: must be a non-empty string"]
    if len(text) > limit:
        return [f"{where}.text: {len(text)} characters, limit {limit}"]
    return []


def block_errors(blocks: Any) -> list[str]:
    """Violations of Slack's Block Kit limits for the block types kvwatch sends ([] = valid)."""
    if isinstance(blocks, str):
        try:
            blocks = json.loads(blocks)
        except ValueError:
            return ["blocks: not JSON"]
    if not isinstance(blocks, list) or not blocks:
        return ["blocks: expected a non-empty list"]
    errs = [f"blocks: {len(blocks)} blocks, limit 50"] if len(blocks) > 50 else []
    for i, b in enumerate(blocks):
        w = f"blocks[{i}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "header":
            errs += _text_obj(b.get("text"), f"{w}.text", 150, ("plain_text",))
        elif kind == "section":
            if "text" not in b and "fields" not in b:
                errs.append(f"{w}: section needs text or fields")
            if "text" in b:
                errs += _text_obj(b["text"], f"{w}.text", 3000)
            fields = b.get("fields", [])
            if len(fields) > 10:
                errs.append(f"{w}.fields: {len(fields)} fields, limit 10")
            for j, f in enumerate(fields):
                errs += _text_obj(f, f"{w}.fields[{j}]", 2000)
        elif kind == "context":
            elems = b.get("elements") or []
            if not 1 <= len(elems) <= 10:
                errs.append(f"{w}.elements: {len(elems)} elements, expected 1-10")
            for j, e in enumerate(elems):
                errs += _text_obj(e, f"{w}.elements[{j}]", 3000)
        elif kind == "actions":
            elems = b.get("elements") or []
            if not 1 <= len(elems) <= 25:
                errs.append(f"{w}.elements: {len(elems)} elements, expected 1-25")
            for j, e in enumerate(elems):
                errs += _text_obj(e.get("text"), f"{w}.elements[{j}].text", 75, ("plain_text",))
                if len(str(e.get("url", ""))) > 3000:
                    errs.append(f"{w}.elements[{j}].url: longer than 3000")
                if len(str(e.get("action_id", ""))) > 255:
                    errs.append(f"{w}.elements[{j}].action_id: longer than 255")
        else:
            errs.append(f"{w}: unexpected block type {kind!r}")
    return errs


def message_errors(body: dict[str, Any]) -> list[str]:
    """Block and top-level ``text`` violations of one message body (postMessage, update, webhook)."""
    errs = block_errors(body["blocks"]) if "blocks" in body else []
    text = body.get("text")
    if text is not None and (not isinstance(text, str) or len(text) > 40000):
        errs.append("text: not a string or longer than 40000")
    return errs


class FakeSlack:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}  # (channel, ts) → latest message
        self._fail: list[tuple[int, float | None, str, str]] = []
        self.hook: Callable[[str, str, dict[str, Any]], None] | None = None
        self._lock = threading.Lock()
        self._ts = 1_700_000_000
        self.url = ""
        self.uploads: dict[str, int] = {}
        #: (method, violations) of every message refused as invalid_blocks
        self.rejected: list[tuple[str, list[str]]] = []

    # ---- test controls -------------------------------------------------------------------------
    def fail_next(self, n: int, status: int = 500, retry_after: float | None = None, error: str = "",
                  method: str = "") -> None:
        """Answer the next ``n`` calls (of ``method``, if given) with ``status`` and Slack ``error``."""
        with self._lock:
            self._fail.extend([(status, retry_after, error, method)] * n)

    def parents(self, channel: str | None = None) -> list[tuple[str, str]]:
        """(channel, ts) of every top-level message, oldest first."""
        return sorted(((c, ts) for (c, ts), m in self.messages.items()
                       if not m.get("thread_ts") and (channel is None or c == channel)), key=lambda k: k[1])

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
        if self.hook is not None:
            self.hook(method, "before", body)
        with self._lock:
            idx = next((i for i, f in enumerate(self._fail) if not f[3] or f[3] == method), None)
            failure = self._fail.pop(idx) if idx is not None else None
            if failure is not None:
                status, retry, error, _ = failure
                self.calls.append(Call(method, body, time.monotonic(), status, headers))
                extra = {"Retry-After": str(int(retry))} if retry is not None else {}
                err = error or ("ratelimited" if status == 429 else "fatal_error")
                return status, extra, {"ok": False, "error": err}
            errs = message_errors(body) if method in ("chat.postMessage", "chat.update", "webhook") else []
            if errs:
                self.rejected.append((method, errs))
                self.calls.append(Call(method, body, time.monotonic(), 400, headers))
                if method == "webhook":
                    return 400, {}, "invalid_blocks"
                return 200, {}, {"ok": False, "error": "invalid_blocks", "errors": errs}
            answer = self._answer(method, body)
            self.calls.append(Call(method, body, time.monotonic(), 200, headers))
        if self.hook is not None:
            self.hook(method, "after", body)
        return 200, {}, answer

    def _answer(self, method: str, body: dict[str, Any]) -> Any:
        if method == "webhook":
            return "ok"
        if method == "chat.postMessage":
            self._ts += 1
            ts = f"{self._ts}.000100"
            channel = body.get("channel", "")
            self.messages[(channel, ts)] = {**_decoded(body), "ts": ts}
            return {"ok": True, "channel": channel, "ts": ts, "message": {"text": body.get("text", "")}}
        if method == "chat.update":
            key = (body.get("channel", ""), body.get("ts", ""))
            if key not in self.messages:
                return {"ok": False, "error": "message_not_found"}
            self.messages[key] = {**self.messages[key], **_decoded(body)}
            return {"ok": True, "channel": key[0], "ts": key[1]}
        if method == "conversations.history":
            channel, oldest = body.get("channel", ""), float(body.get("oldest") or 0)
            meta = str(body.get("include_all_metadata", "")).lower() in ("1", "true")
            msgs = [{k: v for k, v in m.items() if meta or k != "metadata"}
                    for (c, ts), m in sorted(self.messages.items(), key=lambda kv: kv[0][1], reverse=True)
                    if c == channel and not m.get("thread_ts") and float(ts) >= oldest]
            return {"ok": True, "messages": msgs, "has_more": False}
        if method == "conversations.list":
            names = sorted({c for c, _ in self.messages} | {"#kvwatch"})
            return {"ok": True, "channels": [{"id": n, "name": n.lstrip("#")} for n in names],
                    "response_metadata": {"next_cursor": ""}}
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


def _decoded(body: dict[str, Any]) -> dict[str, Any]:
    """Form-encoded calls carry JSON strings (``metadata``, ``blocks``): keep them as objects."""
    out = dict(body)
    for k in ("metadata", "blocks"):
        if isinstance(out.get(k), str):
            with suppress(ValueError):
                out[k] = json.loads(out[k])
    return out


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
