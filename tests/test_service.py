from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from test_lifecycle import diag, result, unknown

from kvwatch.alerting.lifecycle import Event
from kvwatch.alerting.state import ResilientStore
from kvwatch.config import Settings, load_settings
from kvwatch.core.models import Evaluation, TargetResult
from kvwatch.core.rules import load_ruleset
from kvwatch.errors import ConfigError, PrometheusUnreachable
from kvwatch.service.cycle import Service
from kvwatch.service.http import HttpServer
from kvwatch.service.runner import Runner
from kvwatch.service.selfmetrics import SelfMetrics

T0 = 1_800_000_000.0


class Recorder:
    name = "rec"

    def __init__(self) -> None:
        self.events: list[Event] = []

    def deliver(self, event: Event, threads: object) -> None:
        self.events.append(event)


class Script:
    """An evaluator that plays back results (or raises) one cycle at a time."""

    def __init__(self, steps: list[list[TargetResult] | Exception]) -> None:
        self.steps = steps
        self.calls = 0

    def __call__(self, client: object, settings: Settings, rules: object, at: datetime) -> Evaluation:
        step = self.steps[min(self.calls, len(self.steps) - 1)]
        self.calls += 1
        if isinstance(step, Exception):
            raise step
        return Evaluation(evaluated_at=at, results=tuple(step), window_s=600.0, queries=0)


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def make(tmp_path: Path, steps: list, *, dry_run: bool = False, db: str = "s.db"):
    s = load_settings(None, environ={}, overrides={"lifecycle": {"hold_down": "60s"}})
    metrics = SelfMetrics()
    store = ResilientStore(str(tmp_path / db), on_error=lambda _m: metrics.state_errors.inc())
    rec, clock = Recorder(), Clock()
    svc = Service(
        settings=s, rules=load_ruleset(), client=object(), store=store, notifiers={"rec": rec},
        metrics=metrics, clock=clock, dry_run=dry_run, evaluator=Script(steps),
    )
    return svc, rec, clock, metrics


def sample(metrics: SelfMetrics, name: str, **labels: str) -> float | None:
    for s in metrics.registry.collect():
        for smp in s.samples:
            if smp.name == name and all(smp.labels.get(k) == v for k, v in labels.items()):
                return smp.value
    return None


def test_cycle_survives_failures_and_logs_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    firing = [result(diag(for_s=0))]
    steps = [PrometheusUnreachable("http://p:9090", "connection refused"), RuntimeError("boom"), firing, firing]
    svc, rec, clock, m = make(tmp_path, steps)
    caplog.set_level(logging.INFO, logger="kvwatch")
    reports = []
    for _ in range(4):
        reports.append(svc.cycle())
        clock.t += 60
    assert [r.ok for r in reports] == [False, False, True, True]
    assert "http://p:9090" in reports[0].error and "boom" in reports[1].error
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("kvwatch cycle")]
    assert len(lines) == 4
    assert "targets: 1 (full 1)" in lines[2] and "fired 1" in lines[2] and "sent 1" in lines[2]
    assert sample(m, "kvwatch_cycles_total", outcome="error") == 2
    assert sample(m, "kvwatch_cycles_total", outcome="ok") == 2
    assert sample(m, "kvwatch_incidents_open", mode="full", severity="critical") == 1
    assert sample(m, "kvwatch_target_state", instance="10.0.0.1:8000", state="full") == 1
    assert sample(m, "kvwatch_target_state", instance="10.0.0.1:8000", state="healthy") == 0
    assert sample(m, "kvwatch_diagnosis_active", mode="full", severity="critical") == 1
    assert sample(m, "kvwatch_notifications_total", sink="rec", outcome="ok") == 1
    assert sample(m, "kvwatch_last_cycle_timestamp_seconds") == T0 + 180
    assert len(rec.events) == 1


def test_dry_run_sends_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    svc, rec, _, _ = make(tmp_path, [[result(diag(for_s=0))]], dry_run=True)
    caplog.set_level(logging.INFO, logger="kvwatch")
    assert svc.cycle().fired == 1
    assert rec.events == [] and svc.store.pending() == 0
    assert any("dry-run: kvwatch alert fire mode=full" in r.getMessage() for r in caplog.records)


def test_corrupt_state_keeps_running(tmp_path: Path) -> None:
    (tmp_path / "bad.db").write_bytes(b"garbage" * 500)
    svc, rec, _, m = make(tmp_path, [[result(diag(for_s=0))]], db="bad.db")
    assert svc.cycle().ok and len(rec.events) == 1
    assert sample(m, "kvwatch_state_errors_total") == 1


def test_blind_target_metrics(tmp_path: Path) -> None:
    svc, _, _, m = make(tmp_path, [[unknown()]])
    svc.cycle()
    assert sample(m, "kvwatch_targets", state="unknown") == 1
    assert sample(m, "kvwatch_target_missing_signals", instance="10.0.0.1:8000") == 1


def test_http_endpoints(tmp_path: Path) -> None:
    svc, _, _, m = make(tmp_path, [[result()]])
    http = HttpServer("127.0.0.1", 0, m.registry, ready=lambda: svc.ready(180)).start()
    base = f"http://127.0.0.1:{http.port}"
    try:
        assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
        assert requests.get(f"{base}/readyz", timeout=5).status_code == 503
        svc.cycle()
        assert requests.get(f"{base}/readyz", timeout=5).status_code == 200
        text = requests.get(f"{base}/metrics", timeout=5).text
        names = {f.name for f in text_string_to_metric_families(text)}
        for want in ("kvwatch_cycle_duration_seconds", "kvwatch_cycles", "kvwatch_queries", "kvwatch_query_errors",
                     "kvwatch_last_cycle_timestamp_seconds", "kvwatch_targets", "kvwatch_target_state",
                     "kvwatch_incidents_open", "kvwatch_config_reload_errors", "kvwatch_state_errors",
                     "kvwatch_notifications", "kvwatch_target_missing_signals"):
            assert want in names, want
        assert "python_gc_objects_collected_total" not in text  # our registry only, not the global one
    finally:
        http.stop()


def test_reload_keeps_last_good_config(tmp_path: Path) -> None:
    svc, _, _, m = make(tmp_path, [[result()]])
    good = load_settings(None, environ={}, overrides={"evaluation": {"interval": "30s"}})
    answers: list[Callable[[], tuple]] = [
        lambda: (_ for _ in ()).throw(ConfigError("kvwatch.yaml: evaluation.window: got 'x'")),
        lambda: (good, load_ruleset()),
    ]
    runner = Runner(svc, lambda: answers.pop(0)())
    before = svc.settings
    runner.do_reload()
    assert svc.settings is before and sample(m, "kvwatch_config_reload_errors_total") == 1
    runner.do_reload()
    assert svc.settings.evaluation.interval == 30.0
    assert runner.scheduler.get_job("cycle") is not None  # interval changed → rescheduled


def test_once_notify_assumes_held_and_does_not_repeat(tmp_path: Path) -> None:
    from datetime import UTC

    from support.fake_slack import fake_slack

    from kvwatch.service.once import notify_once

    with fake_slack() as fake:
        s = load_settings(None, environ={}, overrides={
            "slack": {"bot_token": "xoxb-t", "channel": "C1", "api_url": fake.api_url},
            "state": {"path": str(tmp_path / "once.db")},
        })
        at = datetime.fromtimestamp(T0, tz=UTC)
        ev = Evaluation(evaluated_at=at, results=(result(diag(for_s=600)),), window_s=1800.0)
        notify_once(s, ev)  # a 10-minute `for` met within the window: fires at once
        notify_once(s, Evaluation(evaluated_at=datetime.fromtimestamp(T0 + 60, tz=UTC),
                                  results=ev.results, window_s=1800.0))
        assert len(fake.of("chat.postMessage")) == 1


def test_failed_cycle_line_reports_the_open_incidents(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 17 item 15: a failed cycle's line said `open 0` while incidents were open."""
    svc, _, clock, _ = make(tmp_path, [[result(diag(for_s=0))], PrometheusUnreachable("http://prom:9090", "refused")])
    assert svc.cycle().open == 1
    clock.t += 60
    caplog.clear()
    report = svc.cycle()
    assert not report.ok and report.open == 1
    (line,) = [r.message for r in caplog.records if "kvwatch cycle" in r.message]
    assert "open 1" in line and "error" in line


def test_overrunning_evaluation_is_dropped_and_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 17 item 9: an evaluation past its deadline does not hold the cycle; the line says so."""
    import threading
    import time as _time

    release = threading.Event()
    svc, _, _, _ = make(tmp_path, [[result(diag(for_s=0))]])
    svc.settings = svc.settings.model_copy(update={"evaluation": svc.settings.evaluation.model_copy(
        update={"interval": 1.0})})

    def slow(*_a: object) -> Evaluation:
        release.wait(10)
        return Evaluation(evaluated_at=datetime.now(), results=(), window_s=60.0)

    svc.evaluator = slow
    t = _time.monotonic()
    first = svc.cycle()
    second = svc.cycle()
    assert _time.monotonic() - t < 2.0, "a cycle waited for the slow evaluation"
    release.set()
    assert first.dropped == ["evaluation (over its 0.7s deadline)"]
    assert second.dropped == ["evaluation (the previous one is still running)"]
    lines = [r.message for r in caplog.records if "kvwatch cycle" in r.message]
    assert len(lines) == 2 and all("dropped: evaluation" in ln for ln in lines)


def test_a_note_on_the_configuration_is_logged_when_it_appears_and_not_every_cycle(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The service logs kvwatch's remark on its configuration against the data (an SLO inside a
    TTFT bucket) once when it appears and again only when it changes, not every minute."""
    svc, _rec, clock, _m = make(tmp_path, [[]])
    note = "the TTFT SLO (2 s, evaluation.ttft_slo) lies inside the TTFT bucket (1, 2.5]"
    notes = [(note,), (note,), (), (note,)]

    def evaluator(client: object, settings: Settings, rules: object, at: datetime) -> Evaluation:
        return Evaluation(evaluated_at=at, results=(), window_s=600.0, notes=notes.pop(0))

    svc.evaluator = evaluator
    caplog.set_level(logging.INFO, logger="kvwatch")
    for _ in range(4):
        svc.cycle()
        clock.t += 60
    logged = [r.getMessage() for r in caplog.records if "inside the TTFT bucket" in r.getMessage()]
    assert len(logged) == 2 and all(r.levelno == logging.WARNING for r in caplog.records
                                    if "inside the TTFT bucket" in r.getMessage()), logged
