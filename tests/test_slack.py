from __future__ import annotations

import time
from pathlib import Path

from support.fake_slack import FakeSlack, fake_slack
from test_lifecycle import FULL_KEY, diag, lc, result

from kvwatch.alerting.lifecycle import Lifecycle
from kvwatch.alerting.sinks.outbox import drain
from kvwatch.alerting.sinks.slack import SlackNotifier, SlackWebhookNotifier, route
from kvwatch.alerting.state import ResilientStore
from kvwatch.config import Settings, load_settings
from kvwatch.core.models import Severity

T0 = 1_800_000_000.0


def settings(fake: FakeSlack, **slack: object) -> Settings:
    over = {
        "slack": {"bot_token": "xoxb-test", "channel": "C-DEFAULT", "api_url": fake.api_url, **slack},
        "links": {"grafana_url": "http://grafana.example", "dashboard_uid": "kvwatch-instance"},
        "prometheus": {"url": "http://prom.example:9090"},
    }
    return load_settings(None, environ={}, overrides=over)


class Kvwatch:
    """One 'process': its own objects over a shared SQLite file."""

    def __init__(self, s: Settings, db: Path, life: Lifecycle) -> None:
        self.store = ResilientStore(str(db))
        self.slack = SlackNotifier(s)
        self.life = life

    def cycle(self, results: list, now: float):
        incidents, events = self.life.step(self.store.load(), results, now)
        self.store.commit(incidents, [("slack", e) for e in events])
        return drain(self.store, {"slack": self.slack}, now)


def test_fire_ongoing_restart_resolve(tmp_path: Path) -> None:
    with fake_slack() as fake:
        s = settings(fake)
        life = lc(hold_down=120)
        firing, clear = [result(diag(for_s=0))], [result()]
        a = Kvwatch(s, tmp_path / "state.db", life)
        assert a.cycle(firing, T0).sent == 1
        posts = fake.of("chat.postMessage")
        assert len(posts) == 1
        parent = posts[0].body
        assert parent["channel"] == "C-DEFAULT" and "thread_ts" not in parent
        assert posts[0].headers["authorization"] == "Bearer xoxb-test"
        kinds = [b["type"] for b in parent["blocks"]]
        assert kinds[0] == "header" and "context" in kinds and "actions" in kinds
        head = parent["blocks"][0]["text"]["text"]
        assert "FULL" in head and "critical" in head and "10.0.0.1:8000" in head
        fields = next(b for b in parent["blocks"] if "fields" in b)["fields"]
        assert "observed 0.97" in fields[0]["text"] and "≥ 0.9" in fields[0]["text"]
        triage = next(b for b in parent["blocks"] if "Triage" in b.get("text", {}).get("text", ""))
        assert "1. one\n2. two" in triage["text"]["text"]
        ctx = " · ".join(e["text"] for e in next(b for b in parent["blocks"] if b["type"] == "context")["elements"])
        assert "confidence 90%" in ctx and "full-rule" in ctx
        urls = [e["url"] for e in next(b for b in parent["blocks"] if b["type"] == "actions")["elements"]]
        assert urls[0].startswith("http://grafana.example/d/kvwatch-instance?") and "var-instance=10.0.0.1%3A8000" in urls[0]
        assert "from=" in urls[0] and "to=" in urls[0]
        assert urls[1].startswith("http://prom.example:9090/graph?g0.expr=") and "kv_cache_usage_perc" in urls[1]

        # still firing: no new parent, across a restart too
        a.cycle(firing, T0 + 60)
        a.store.close()
        b = Kvwatch(s, tmp_path / "state.db", life)
        b.cycle(firing, T0 + 120)
        b.cycle(clear, T0 + 180)  # hold-down starts
        assert len(fake.of("chat.postMessage")) == 1 and fake.of("chat.update") == []
        b.store.close()

        c = Kvwatch(s, tmp_path / "state.db", life)
        assert c.cycle(clear, T0 + 300).sent == 1  # clear since 120 → resolves at ≥ 240
        c.cycle(clear, T0 + 360)
        posts = fake.of("chat.postMessage")
        assert len(posts) == 2 and posts[1].body["thread_ts"] == next(iter(fake.messages))[1]
        assert "RESOLVED" in posts[1].body["text"] and "after 5m" in posts[1].body["text"]
        updates = fake.of("chat.update")
        assert len(updates) == 1
        status = updates[0].body["blocks"][1]["text"]["text"]
        assert "RESOLVED" in status and "after 5m" in status
        assert c.store.pending() == 0


def test_rate_limit_defers_instead_of_sleeping_in_the_cycle(tmp_path: Path) -> None:
    """Defect 9: a 429 slept out its Retry-After inside the cycle; now the outbox defers it."""
    with fake_slack() as fake:
        k = Kvwatch(settings(fake), tmp_path / "s.db", lc())
        fake.fail_next(1, status=429, retry_after=30, method="chat.postMessage")
        t = time.monotonic()
        report = k.cycle([result(diag(for_s=0))], T0)
        assert (report.sent, report.failed) == (0, 1) and time.monotonic() - t < 5.0
        assert k.store.due(T0 + 29) == [] and len(k.store.due(T0 + 30)) == 1
        assert k.cycle([result(diag(for_s=0))], T0 + 30).sent == 1
        assert [c.status for c in fake.calls if c.method == "chat.postMessage"] == [429, 200]
        assert len(fake.parents()) == 1


def test_permanent_error_is_dead_lettered_and_the_rest_flows(tmp_path: Path, caplog) -> None:
    """Defect 10: channel_not_found was retried forever; now one line naming the route and the fix."""
    with fake_slack() as fake:
        from kvwatch.core.models import Target, TargetKey

        k = Kvwatch(settings(fake), tmp_path / "s.db", lc())
        other = Target(TargetKey("vllm", "10.0.0.2:8000"), dialect="vllm-v1", engine="vllm", model="llama")
        fake.fail_next(1, status=200, error="channel_not_found", method="chat.postMessage")
        report = k.cycle([result(diag(for_s=0)), result(diag(for_s=0), target=other)], T0)
        assert (report.sent, report.dead) == (1, 1) and k.store.pending() == 0
        lines = [r.message for r in caplog.records if "giving up" in r.message]
        assert len(lines) == 1 and "route C-DEFAULT" in lines[0] and "channel_not_found" in lines[0]
        assert "slack.channel" in lines[0]
        assert k.cycle([result(diag(for_s=0)), result(diag(for_s=0), target=other)], T0 + 10).sent == 0


def test_lost_state_adopts_the_open_thread_instead_of_a_second_parent(tmp_path: Path) -> None:
    """Defects 7/8: with the state gone (or the ts never recorded) the parent is found again in
    Slack through its message metadata; no second parent is posted."""
    with fake_slack() as fake:
        s = settings(fake)
        a = Kvwatch(s, tmp_path / "a.json", lc(hold_down=0))
        assert a.cycle([result(diag(for_s=0))], T0).sent == 1
        b = Kvwatch(s, tmp_path / "b.json", lc(hold_down=0))  # no state at all: a new episode uid
        assert b.cycle([result(diag(for_s=0))], T0 + 60).sent == 1
        assert len(fake.parents()) == 1 and len(fake.of("chat.update")) == 1
        assert b.cycle([result()], T0 + 120).sent == 1  # the resolve lands in the adopted thread
        (parent,) = fake.parents()
        assert "*RESOLVED*" in str(fake.messages[parent]["blocks"])
        assert fake.messages[parent]["metadata"]["event_payload"]["state"] == "resolved"
        c = Kvwatch(s, tmp_path / "c.json", lc(hold_down=0))  # a resolved thread is never adopted
        assert c.cycle([result(diag(for_s=0))], T0 + 300).sent == 1 and len(fake.parents()) == 2


def test_server_error_retried_next_cycle_without_duplicates(tmp_path: Path) -> None:
    with fake_slack() as fake:
        k = Kvwatch(settings(fake), tmp_path / "s.db", lc(hold_down=0))
        fake.fail_next(3, status=500)  # the in-process retries (2) are exhausted too
        firing = [result(diag(for_s=0))]
        r1 = k.cycle(firing, T0)
        assert (r1.sent, r1.failed) == (0, 1) and "HTTP 500" in r1.errors[0]
        assert k.store.pending() == 1 and fake.of("chat.postMessage") == []
        # the resolve queued behind the undelivered fire must wait for it
        r2 = k.cycle([result()], T0 + 5)
        assert r2.sent == 0 and r2.deferred == 2
        r3 = k.cycle([result()], T0 + 60)
        assert r3.sent == 2 and k.store.pending() == 0
        posts = fake.of("chat.postMessage")
        assert len(posts) == 2 and "thread_ts" not in posts[0].body and "thread_ts" in posts[1].body


def test_routes_by_severity_and_labels(tmp_path: Path) -> None:
    with fake_slack() as fake:
        s = settings(
            fake,
            routes=[
                {"channel": "C-PAGE", "min_severity": "critical", "match": {"model": "llama"}},
                {"channel": "C-WARN", "min_severity": "warning"},
            ],
        )
        life = lc()
        incs, _ = life.step({}, [result(diag(for_s=0))], T0)
        assert route(s.slack, incs[FULL_KEY]) == "C-PAGE"
        incs, _ = life.step({}, [result(diag(sev=Severity.WARNING, for_s=0))], T0)
        assert route(s.slack, incs[FULL_KEY]) == "C-WARN"
        k = Kvwatch(s, tmp_path / "s.db", life)
        k.cycle([result(diag(for_s=0))], T0)
        assert fake.of("chat.postMessage")[0].body["channel"] == "C-PAGE"


def test_webhook_mode(tmp_path: Path) -> None:
    with fake_slack() as fake:
        s = load_settings(None, environ={"SLACK_WEBHOOK_URL": fake.webhook_url}, overrides={})
        store = ResilientStore(str(tmp_path / "s.db"))
        life = lc(hold_down=0)
        hook = SlackWebhookNotifier(s)
        incs, ev = life.step({}, [result(diag(for_s=0))], T0)
        store.commit(incs, [("slack-webhook", e) for e in ev])
        fake.fail_next(3, status=500)
        assert drain(store, {"slack-webhook": hook}, T0).failed == 1
        assert drain(store, {"slack-webhook": hook}, T0 + 60).sent == 1
        incs, ev = life.step(incs, [result()], T0 + 120)
        store.commit(incs, [("slack-webhook", e) for e in ev])
        assert drain(store, {"slack-webhook": hook}, T0 + 120).sent == 1
        hooks = fake.of("webhook")
        assert len(hooks) == 2
        assert hooks[0].body["blocks"][0]["type"] == "header" and "RESOLVED" in hooks[1].body["text"] + str(hooks[1].body["blocks"])


def test_chart_uploaded_to_thread(tmp_path: Path) -> None:
    from kvwatch.alerting.sinks.chart import render_png

    class Prom:
        url = "http://prom"

        def range(self, query: str, start: object, end: object, step: float) -> list:
            return [{"metric": {}, "values": [[T0 - 600 + 30 * i, str(0.5 + i / 100)] for i in range(30)]}]

    with fake_slack() as fake:
        s = settings(fake, charts=True)
        life = lc()
        incs, events = life.step({}, [result(diag(for_s=0))], T0)
        png = render_png(s, Prom(), incs[FULL_KEY], T0)  # type: ignore[arg-type]
        assert png is not None and png.startswith(b"\x89PNG")
        store = ResilientStore(str(tmp_path / "s.db"))
        store.commit(incs, [("slack", e) for e in events])
        slack = SlackNotifier(s, chart=lambda inc, now: render_png(s, Prom(), inc, now))  # type: ignore[arg-type]
        assert drain(store, {"slack": slack}, T0).sent == 1
        done = fake.of("files.completeUploadExternal")
        parent_ts = next(iter(fake.messages))[1]
        assert len(done) == 1 and done[0].body["thread_ts"] == parent_ts and done[0].body["channel_id"] == "C-DEFAULT"
        assert list(fake.uploads.values()) == [len(png)]


def test_restart_without_state_resolves_threads_of_engines_that_cleared(tmp_path: Path) -> None:
    """Defect 7: with the state lost and the condition gone while kvwatch was down, the old thread
    showed FIRING forever; the first cycle after start resolves it (only for engines it evaluated)."""
    with fake_slack() as fake:
        s = settings(fake)
        a = Kvwatch(s, tmp_path / "a.json", lc())
        assert a.cycle([result(diag(for_s=0))], T0).sent == 1
        b = SlackNotifier(s)
        assert b.sweep({("vllm", "10.0.0.9:8000")}, T0 + 60) == 0  # another engine: untouched
        assert b.sweep({("vllm", "10.0.0.1:8000")}, T0 + 60) == 1
        (parent,) = fake.parents()
        msg = fake.messages[parent]
        assert "*RESOLVED*" in str(msg["blocks"]) and "*FIRING*" not in str(msg["blocks"])
        assert msg["metadata"]["event_payload"]["state"] == "resolved"
        assert b.sweep({("vllm", "10.0.0.1:8000")}, T0 + 120) == 0 and fake.rejected == []
