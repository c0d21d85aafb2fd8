from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from support.prom import free_port, require_binary, server_process
from test_lifecycle import FULL_KEY, diag, lc, result

from kvwatch.alerting.sinks.alertmanager import AlertmanagerSink
from kvwatch.config import load_settings
from kvwatch.core.models import Target, TargetKey

pytestmark = pytest.mark.alertmanager


@contextmanager
def webhook_receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    got: list[dict[str, Any]] = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_POST(self) -> None:
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/hook", got
    finally:
        srv.shutdown()
        srv.server_close()


@contextmanager
def alertmanager(hook: str) -> Iterator[str]:
    binary = require_binary("prometheus-alertmanager", "alertmanager")
    work = Path(tempfile.mkdtemp(prefix="kvwatch-am-"))
    (work / "am.yml").write_text(
        "route:\n  receiver: rec\n  group_by: ['alertname', 'instance']\n  group_wait: 0s\n"
        "  group_interval: 1s\n  repeat_interval: 1h\n"
        f"receivers:\n  - name: rec\n    webhook_configs:\n      - url: {hook}\n        send_resolved: true\n"
    )
    port = free_port()
    args = [binary, f"--config.file={work / 'am.yml'}", f"--storage.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="]
    url = f"http://127.0.0.1:{port}"
    try:
        with server_process(args, f"{url}/-/ready", work / "am.log", timeout=30):
            yield url
    finally:
        shutil.rmtree(work, ignore_errors=True)


def poll(fn: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = fn()
        if out:
            return out
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_alerts_resolve_and_silence() -> None:
    with webhook_receiver() as (hook, got), alertmanager(hook) as am:
        s = load_settings(None, environ={}, overrides={
            "alertmanager": {"urls": [am]},
            "links": {"grafana_url": "http://grafana.example"},
        })
        sink = AlertmanagerSink(s)
        life = lc(hold_down=0)
        now = time.time() - 10  # the resolution (now + 5) lies in the past, as it does in a real cycle
        incs, _ = life.step({}, [result(diag(for_s=0))], now)
        for _ in range(2):  # re-posting every cycle is idempotent in Alertmanager
            assert all(r.ok for r in sink.sync(incs.values(), now))
        alerts = poll(lambda: requests.get(f"{am}/api/v2/alerts", timeout=5).json())
        assert len(alerts) == 1
        a = alerts[0]
        assert a["labels"] == {"alertname": "KVCacheFull", "mode": "full", "severity": "critical", "job": "vllm",
                               "instance": "10.0.0.1:8000", "model": "llama", "engine": "vllm"}
        assert a["annotations"]["summary"] == "full summary"
        assert a["annotations"]["triage"] == "1. one\n2. two"
        assert a["annotations"]["dashboard_url"].startswith("http://grafana.example/d/kvwatch-instance?")
        assert a["status"]["state"] == "active"
        firing = poll(lambda: [g for g in got if g["status"] == "firing"])
        assert firing[0]["alerts"][0]["labels"]["alertname"] == "KVCacheFull"

        incs, _ = life.step(incs, [result()], now + 5)
        assert incs[FULL_KEY].resolved_at == now + 5
        sink.sync(incs.values(), now + 5)
        resolved = poll(lambda: [g for g in got if g["status"] == "resolved"])
        ends = datetime.fromisoformat(resolved[0]["alerts"][0]["endsAt"].replace("Z", "+00:00"))
        assert abs(ends.timestamp() - (now + 5)) < 0.01
        assert poll(lambda: requests.get(f"{am}/api/v2/alerts?active=true", timeout=5).json() == [] or None)

        # a silence created through the Alertmanager API suppresses another target's alert
        start = datetime.now(tz=UTC)
        silence = {
            "matchers": [{"name": "instance", "value": "10.0.0.2:8000", "isRegex": False, "isEqual": True}],
            "startsAt": start.isoformat(), "endsAt": (start + timedelta(hours=1)).isoformat(),
            "createdBy": "test", "comment": "maintenance",
        }
        assert requests.post(f"{am}/api/v2/silences", json=silence, timeout=5).status_code == 200
        other = Target(TargetKey("vllm", "10.0.0.2:8000"), dialect="vllm-v1", engine="vllm", model="llama")
        incs2, _ = life.step({}, [result(diag(for_s=0), target=other)], now + 6)
        n_hooks = len(got)
        sink.sync(incs2.values(), now + 6)

        def suppressed() -> list[dict[str, Any]]:
            al = requests.get(f"{am}/api/v2/alerts", timeout=5).json()
            return [x for x in al if x["labels"]["instance"] == "10.0.0.2:8000" and x["status"]["state"] == "suppressed"]

        hit = poll(suppressed)
        assert hit[0]["status"]["silencedBy"]
        time.sleep(1.5)  # two group intervals: a delivery would have happened by now
        assert all(a["labels"]["instance"] != "10.0.0.2:8000" for g in got[n_hooks:] for a in g["alerts"])


def test_unreachable_alertmanager_is_reported_not_raised() -> None:
    s = load_settings(None, environ={}, overrides={"alertmanager": {"urls": [f"http://127.0.0.1:{free_port()}"],
                                                                     "timeout": "1s"}})
    incs, _ = lc().step({}, [result(diag(for_s=0))], time.time())
    res = AlertmanagerSink(s).sync(incs.values(), time.time())
    assert len(res) == 1 and not res[0].ok and res[0].error
