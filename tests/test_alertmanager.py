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
from support.prom import free_port, on_free_ports, require_binary, server_process
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

    @contextmanager
    def start(ports: list[int]) -> Iterator[str]:
        args = [binary, f"--config.file={work / 'am.yml'}", f"--storage.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{ports[0]}", "--cluster.listen-address="]
        url = f"http://127.0.0.1:{ports[0]}"
        with server_process(args, f"{url}/-/ready", work / "am.log", timeout=30):
            yield url

    try:
        with on_free_ports(start) as url:
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


class FlakySession(requests.Session):
    """A real session whose next ``fail`` POSTs raise, as a network blip would."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = 0

    def post(self, *a: Any, **kw: Any) -> requests.Response:  # type: ignore[override]
        if self.fail:
            self.fail -= 1
            raise requests.ConnectionError("connection reset (injected)")
        return super().post(*a, **kw)


def test_failed_resolve_post_is_retried_for_15_minutes() -> None:
    """Defect 11: the resolved alert was posted once; one failed POST lost it."""
    from kvwatch.alerting.sinks.alertmanager import RESOLVED_RETENTION_S

    with webhook_receiver() as (hook, got), alertmanager(hook) as am:
        s = load_settings(None, environ={}, overrides={"alertmanager": {"urls": [am]}})
        session = FlakySession()
        sink = AlertmanagerSink(s, session=session)
        life = lc(hold_down=0)
        now = time.time() - 10
        incs, _ = life.step({}, [result(diag(for_s=0))], now)
        assert all(r.ok for r in sink.sync(incs.values(), now))
        poll(lambda: [g for g in got if g["status"] == "firing"])
        incs, _ = life.step(incs, [result()], now + 5)
        session.fail = 1
        assert not any(r.ok for r in sink.sync(incs.values(), now + 5))  # the resolve is lost on the wire
        incs, _ = life.step(incs, [result()], now + 7)  # the resolved incident is dropped by the lifecycle
        assert incs == {}
        assert all(r.ok for r in sink.sync(incs.values(), now + 7))  # ... but the sink re-sends it
        resolved = poll(lambda: [g for g in got if g["status"] == "resolved"])
        ends = datetime.fromisoformat(resolved[0]["alerts"][0]["endsAt"].replace("Z", "+00:00"))
        assert abs(ends.timestamp() - (now + 5)) < 0.01
        assert sink.alerts([], now + 5 + RESOLVED_RETENTION_S - 1) != []
        assert sink.alerts([], now + 5 + RESOLVED_RETENTION_S + 1) == []


def test_kvwatch_silence_is_created_in_alertmanager_and_sends_no_false_resolve() -> None:
    """Defect 12: a kvwatch silence stopped posting, Alertmanager expired the alert at endsAt and
    paged "resolved". Now the alert keeps being posted and Alertmanager silences it."""
    from kvwatch.config import Silence

    with webhook_receiver() as (hook, got), alertmanager(hook) as am:
        s = load_settings(None, environ={}, overrides={"alertmanager": {"urls": [am]}})
        sink = AlertmanagerSink(s)
        life = lc()
        # endsAt = now + 5 min: with `now` 295 s in the past the alert expires 5 s from now unless re-sent
        lag = 295.0
        incs, _ = life.step({}, [result(diag(for_s=0))], time.time() - lag)
        sink.sync(incs.values(), time.time() - lag)
        poll(lambda: [g for g in got if g["status"] == "firing"])
        sil = Silence(matchers={"instance": "10.0.0.1:8000"}, comment="maintenance", until="2100-01-01T00:00:00Z")
        s2 = s.model_copy(update={"lifecycle": s.lifecycle.model_copy(update={"silences": (sil,)})})
        life2, sink2 = lc(silences=(sil,)), AlertmanagerSink(s2)
        sink2.sent = sink.sent
        n = len(got)
        t_end = time.monotonic() + 8
        while time.monotonic() < t_end:  # past the old endsAt
            incs, ev = life2.step(incs, [result(diag(for_s=0))], time.time() - lag)
            assert ev == [] and incs[FULL_KEY].silenced
            assert all(r.ok for r in sink2.sync(incs.values(), time.time() - lag))
            time.sleep(1)
        sils = requests.get(f"{am}/api/v2/silences", timeout=5).json()
        mine = [x for x in sils if x["createdBy"] == "kvwatch" and x["status"]["state"] == "active"]
        assert len(mine) == 1 and mine[0]["matchers"][0]["value"] == "10.0.0.1:8000"
        alerts = requests.get(f"{am}/api/v2/alerts", timeout=5).json()
        assert [a["status"]["state"] for a in alerts] == ["suppressed"]
        assert [g["status"] for g in got[n:]] == [], "a notification reached the receiver while silenced"


def test_blind_incident_stays_firing_for_a_bounded_time() -> None:
    """A blind incident is held open (issue 11: blindness never resolves a page, so
    Alertmanager must not expire it into a false "resolved"), but not refreshed forever
    (issue 17, defect 13): it is refreshed for at most ``lifecycle.forget_after`` after it
    went blind, then expires at its ``endsAt``."""
    from test_lifecycle import unknown

    from kvwatch.alerting.sinks.alertmanager import to_alerts

    s = load_settings(None, environ={}, overrides={"alertmanager": {"urls": ["http://am.invalid"]},
                                                   "lifecycle": {"forget_after": "6h"}})
    life = lc()
    incs, _ = life.step({}, [result(diag(for_s=0))], 1000.0)
    incs, _ = life.step(incs, [unknown()], 1060.0)
    assert incs[FULL_KEY].blind_since == 1060.0
    cap = 1060.0 + 6 * 3600
    ends = [datetime.fromisoformat(a["endsAt"].replace("Z", "+00:00")).timestamp()
            for now in (1060.0, 5000.0, cap + 1000) for a in to_alerts(s, incs[FULL_KEY], now)]
    assert ends == [1360.0, 5300.0, cap + 300]  # refreshed while blind, up to the cap
    [a] = to_alerts(s, incs[FULL_KEY], 5000.0)
    assert "held open" in a["annotations"]["blind"]
    sink = AlertmanagerSink(s)
    assert sink.alerts(incs.values(), 5000.0)[0]["endsAt"] == _iso_z(5300.0)  # still firing
    assert sink.alerts(incs.values(), cap + 100)[0]["endsAt"] == _iso_z(cap + 300)  # last refresh
    # past the cap it expires: sent as resolved at its endsAt, then dropped after 15 min
    assert sink.alerts(incs.values(), cap + 400)[0]["endsAt"] == _iso_z(cap + 300)
    assert sink.alerts(incs.values(), cap + 300 + 901) == []


def _iso_z(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
