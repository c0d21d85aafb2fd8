"""Issue 13 acceptance, live: hostile label values and secrets through the real pipeline.

A backfilled fleet whose engines carry hostile ``job``/``instance``/``model_name`` values
(mentions, links, quotes, backslashes, newlines, ANSI escapes, bidi overrides, emoji and a
10,000-character value) is served by a real Prometheus; ``kvwatch once`` (run in-process
through ``main()``) diagnoses it, prints it and notifies the fake Slack (bot and webhook,
which refuses anything over Block Kit limits) and a real Alertmanager.

The secrets test runs the same pipeline with credentials everywhere (Prometheus URL
userinfo and headers, a bot token, a webhook URL, Alertmanager and Grafana URL userinfo)
while Slack fails every call and one Alertmanager is down, at DEBUG log level, then once
more with Prometheus down: no secret appears in any log line, error, output, Slack
payload, Alertmanager payload or the state file.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from fixtures.core import fleet
from support.fake_slack import fake_slack
from support.prom import backfill, free_port, prometheus
from test_alertmanager import alertmanager, webhook_receiver
from test_hostile_slack import assert_safe_message

from kvwatch.cli import main

pytestmark = [pytest.mark.prometheus, pytest.mark.alertmanager, pytest.mark.slow]

LONG = "x" * 10_000
#: (job, instance, model) of engines in trouble (profile "full"): every one must fire
HOSTILE = (
    ("<!channel>", "<https://evil.example|click me>:8000", "<!here> & <@U0123>"),
    ("q\"uo'te\\back", "nl\nforged line\r\x1b[31mred\x1b[0m\u202eexe:8000", "🔥👩‍💻 emoji-model"),
    ("kvw-long", "long:8000", LONG),
    ("kvw-links", "plain:8000", "@channel #general https://evil.example *bold* `code`"),
)
CLEAN = ("vllm", "10.0.0.1:8000", "org/llama")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@dataclass(frozen=True)
class Live:
    prom: str
    at: str


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    end = math.floor((time.time() - 4 * 3600) / 600) * 600
    members = [fleet.Member(j, i, "vllm-0.10", "full", m) for j, i, m in (*HOSTILE, CLEAN)]
    work = tmp_path_factory.mktemp("hostile-prom")
    backfill(fleet.render(members, end).text(), work / "data")
    with prometheus(tsdb=work / "data") as url:
        yield Live(url, datetime.fromtimestamp(end, tz=UTC).isoformat().replace("+00:00", "Z"))


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in [k for k in os.environ if k.startswith(("KVWATCH_", "SLACK_"))]:
        monkeypatch.delenv(k)


def test_hostile_labels_flow_through_slack_alertmanager_and_terminal(
    live: Live, tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_env: None
) -> None:
    # terminal
    assert main(["once", "--prometheus-url", live.prom, "--at", live.at]) == 0
    text = capsys.readouterr().out
    assert not _CONTROL.search(text), repr(_CONTROL.search(text))
    heads = [ln for ln in text.splitlines() if ln[:1] and ln[:1] in "🔴🟠🟡🔵🟢⚪"]
    assert len(heads) == len(HOSTILE) + 1, text
    assert all(ln.startswith("🔴 full") for ln in heads), heads
    assert max(len(ln) for ln in heads) < 200
    assert main(["explain", "forged", "--prometheus-url", live.prom, "--at", live.at]) == 0
    explained = capsys.readouterr().out
    assert "forged line" in explained and not _CONTROL.search(explained), repr(explained[:300])
    start = (datetime.fromisoformat(live.at.replace("Z", "+00:00")) - timedelta(minutes=5)).isoformat()
    assert main(["backtest", "--prometheus-url", live.prom, "--from", start, "--to", live.at]) == 0
    replayed = capsys.readouterr().out
    assert "forged line" in replayed and not _CONTROL.search(replayed), repr(replayed[:300])
    # JSON keeps the real values (machine-readable, escaped by JSON itself)
    assert main(["once", "--prometheus-url", live.prom, "--at", live.at, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = {(t["labels"]["job"], t["labels"]["instance"]): t for t in doc["targets"]}
    assert set(got) == {(j, i) for j, i, _ in (*HOSTILE, CLEAN)}
    assert {t["state"] for t in got.values()} == {"full"}
    assert got[("kvw-long", "long:8000")]["labels"]["model"] == LONG
    # Slack (bot and webhook) and a real Alertmanager
    with fake_slack() as slack, webhook_receiver() as (hook, forwarded), alertmanager(hook) as am:
        cfg = tmp_path / "kvwatch.yaml"
        cfg.write_text(yaml.safe_dump({
            "prometheus": {"url": live.prom},
            "slack": {"bot_token": "xoxb-test", "channel": "C1", "api_url": slack.api_url,
                      "webhook_url": slack.webhook_url},
            # the real Alertmanager validates and accepts; the recorder keeps what kvwatch posted
            # (alerts at a past --at have expired by now, so Alertmanager's API no longer lists them)
            "alertmanager": {"urls": [am, hook.rsplit("/", 1)[0]]},
            "links": {"grafana_url": "http://grafana.example"},
            "state": {"path": str(tmp_path / "state.db")},
        }))
        assert main(["once", "--config", str(cfg), "--at", live.at, "--notify", "--state", str(tmp_path / "state.db")]) == 0
        err = capsys.readouterr().err
        assert "failed 0" in err and "Alertmanager errors" not in err, err
        assert slack.rejected == []
        bodies = [c.body for c in slack.calls if c.method in ("chat.postMessage", "webhook")]
        assert len(bodies) == 2 * (len(HOSTILE) + 1)
        for body in bodies:
            assert_safe_message(body)
        posted = [a for body in forwarded if isinstance(body, list) for a in body]
        assert len(posted) == len(HOSTILE) + 1
        for a in posted:
            for v in [*a["labels"].values(), a["annotations"]["summary"], a["generatorURL"]]:
                assert not _CONTROL.search(v), repr(v[:200])
            assert a["generatorURL"].startswith(live.prom + "/graph?")
        assert {a["labels"]["model"] for a in posted} >= {LONG, "<!here> & <@U0123>"}


SECRETS = {
    "prometheus password": "PromPass-9d1f",
    "header value": "HdrSecret-77aa",
    "bearer token": "BearerSecret-5c3e",
    "slack bot token": "xoxb-424242-SlackSecret-ab12",
    "webhook path": "/webhook/TSECRET0/BSECRET0/HookSecret3f9e",
    "webhook token": "HookSecret3f9e",
    "alertmanager password": "AmPass-1b2c",
    "grafana password": "GfPass-8e8e",
}


def _assert_no_secret(where: str, text: str) -> None:
    for name, secret in SECRETS.items():
        assert secret not in text, f"{name} leaked in {where}: …{text[max(0, text.find(secret) - 80):][:200]}…"


def test_secrets_never_appear_in_a_failing_run(
    live: Live, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    clean_env: None,
) -> None:
    stream = io.StringIO()  # a deployment's own handler on the root logger
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    caplog.set_level(logging.DEBUG)
    for noisy in ("slack_sdk", "urllib3"):  # `kvwatch run` quiets them process-wide; this test wants every line
        caplog.set_level(logging.DEBUG, logger=noisy)
    down = free_port()
    try:
        with fake_slack() as slack, webhook_receiver() as (hook, forwarded), alertmanager(hook) as am:
            slack.fail_next(1000, status=500)  # every Slack call fails: retry handlers log, errors are kept
            prom_url = live.prom.replace("http://", f"http://kvwatch:{SECRETS['prometheus password']}@")
            cfg = tmp_path / "kvwatch.yaml"
            cfg.write_text(yaml.safe_dump({
                "discovery": {"selector": f'{{job="{CLEAN[0]}"}}'},  # one incident: retries take time
                "prometheus": {"url": prom_url,
                               "headers": {"X-Scope-OrgID": SECRETS["header value"],
                                           "Authorization": f"Bearer {SECRETS['bearer token']}"}},
                "slack": {"bot_token": SECRETS["slack bot token"], "channel": "C1", "api_url": slack.api_url,
                          "webhook_url": slack.url + SECRETS["webhook path"], "timeout": "2s"},
                "alertmanager": {"urls": [am.replace("http://", f"http://am:{SECRETS['alertmanager password']}@"),
                                          f"http://am:{SECRETS['alertmanager password']}@127.0.0.1:{down}",
                                          hook.rsplit("/", 1)[0]]},
                "links": {"grafana_url": f"https://grafana:{SECRETS['grafana password']}@grafana.example"},
                "state": {"path": str(tmp_path / "state.db")},
            }))
            assert main(["once", "--config", str(cfg), "--at", live.at, "--notify", "--state", str(tmp_path / "state.db")]) == 0
            assert main(["once", "--config", str(cfg), "--at", live.at, "--notify", "--state", str(tmp_path / "state.db")]) == 0  # retries the outbox
            first = capsys.readouterr()
            assert "failed" in first.err and "Alertmanager errors" in first.err, first.err
            # Prometheus down, credentials in the URL: exit 3 naming the URL without them
            bad = f"http://kvwatch:{SECRETS['prometheus password']}@127.0.0.1:{down}"
            assert main(["once", "--prometheus-url", bad, "--config", str(cfg)]) == 3
            second = capsys.readouterr()
            assert f"127.0.0.1:{down}" in second.err
            alerts = [a for body in forwarded if isinstance(body, list) for a in body]
            assert alerts and am  # what kvwatch posted to every Alertmanager (the recorder is one of them)
            sent = [c for c in slack.calls if c.method != "upload"]
            assert any(c.status == 500 for c in sent) and len(sent) > 2
            assert any("Authorization" in c.headers or "authorization" in c.headers for c in sent)
    finally:
        root.removeHandler(handler)
    records = caplog.records
    assert any(r.levelno == logging.DEBUG for r in records) and any("retry" in r.getMessage().lower()
                                                                    for r in records), "the run logged no retries"
    for r in records:
        _assert_no_secret(f"log record {r.name}", r.getMessage() + (r.exc_text or ""))
    _assert_no_secret("caplog text", caplog.text)
    _assert_no_secret("root handler stream", stream.getvalue())
    _assert_no_secret("stdout/stderr", first.out + first.err + second.out + second.err)
    _assert_no_secret("Slack payloads", json.dumps([c.body for c in sent]))
    _assert_no_secret("Alertmanager payloads", json.dumps(alerts))
    _assert_no_secret("state file", (tmp_path / "state.db").read_bytes().decode("utf-8", "replace"))
    assert all(a["generatorURL"].startswith(live.prom) for a in alerts)


def test_triage_fetch_restricted_to_hostile_instances_reads_exactly_theirs(live: Live) -> None:
    """The triage-only signals of a few flagged targets are read with ``instance=~"…"`` over
    their (hostile) instances: quotes, backslashes, newlines, regex metacharacters and ANSI
    escapes select exactly those targets, with the values an unrestricted read gives them."""
    import numpy as np

    from kvwatch.config import load_settings
    from kvwatch.core.pipeline import Probes, collect_targets, find_targets
    from kvwatch.core.promclient import PromClient
    from kvwatch.core.rules import load_ruleset

    at = datetime.fromisoformat(live.at.replace("Z", "+00:00"))
    client = PromClient(live.prom, timeout_s=30)
    settings = load_settings(None, environ={}, overrides={"prometheus": {"url": live.prom}})
    rules = load_ruleset()
    triage = rules.triage_signals()
    targets = find_targets(client, settings, at)
    probes = Probes(None, {}, {})
    every = collect_targets(client, settings, rules, targets, at, probes=probes, signals=triage)
    hostile = {(j, i) for j, i, _ in HOSTILE[:2]}
    for subset in ([t for t in targets if (t.key.job, t.key.instance) in hostile], targets[:1], targets[-1:]):
        got = collect_targets(client, settings, rules, subset, at, only_these=True, probes=probes, signals=triage)
        assert set(got.series) == {t.key for t in subset}
        held = 0
        for t in subset:
            assert set(got.series[t.key]) == set(every.series[t.key]) <= triage
            for sig, vals in every.series[t.key].items():
                assert np.array_equal(got.series[t.key][sig], vals, equal_nan=True)
                held += bool(np.isfinite(vals).any())
        assert held, "the hostile targets' ITL/TPOT p99 hold data"
