"""Issue 13 items 1-2: label values cannot inject Slack mentions or links, and no message breaks a Block Kit limit.

The fake Slack refuses messages over Slack's limits with ``invalid_blocks``, like Slack does,
so a delivery test fails the way production would.
"""

from __future__ import annotations

import json
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.fake_slack import block_errors, fake_slack

from kvwatch.alerting.lifecycle import Event, EventKind, Incident, IncidentKey, IncidentState
from kvwatch.alerting.sinks import blocks
from kvwatch.alerting.sinks.base import ThreadBook
from kvwatch.alerting.sinks.slack import SlackNotifier, SlackWebhookNotifier
from kvwatch.alerting.state import MemoryStore
from kvwatch.config import load_settings
from kvwatch.core.models import Evidence, FailureMode, Severity

T0 = 1_800_000_000.0
HOSTILE = (
    "<!channel>",
    "<!here|here>",
    "<@U012345>",
    "<https://evil.example|click me>",
    "a & b <tag> \"quoted\" 'single' back\\slash",
    "line1\nline2\r\n\x1b[31mred\x1b[0m\x00nul\u202egnp.exe",
    "🔥👩‍💻 emoji ok",
    "x" * 10_000,
    "&" * 4_000,
)


def incident(job: str = "vllm", instance: str = "10.0.0.1:8000", model: str = "llama", summary: str = "KV full",
             triage: tuple[str, ...] = ("one", "two"), rule_id: str = "full-kv", cause: str = "",
             evidence: tuple[Evidence, ...] | None = None, state: IncidentState = IncidentState.FIRING) -> Incident:
    labels = {"job": job, "instance": instance, "model": model, "engine": "vllm", "dialect": "vllm-v1"}
    ev = evidence if evidence is not None else (Evidence("kv_usage", "mean", 0.97, ">=", 0.9, "10m", True),)
    return Incident(IncidentKey(job, instance), FailureMode.FULL, state, tuple(sorted(labels.items())), rule_id,
                    Severity.CRITICAL, T0 - 600, T0, summary=summary, cause=cause, confidence=0.9, evidence=ev,
                    triage=triage, fired_at=T0 - 60)


def event(inc: Incident, kind: EventKind = EventKind.FIRE) -> Event:
    return Event(kind, inc, T0, previous_severity=Severity.WARNING)


def _mrkdwn_texts(obj: object) -> list[str]:
    """Every mrkdwn text in a block tree."""
    out: list[str] = []
    if isinstance(obj, dict):
        if obj.get("type") == "mrkdwn":
            out.append(obj["text"])
            assert obj.get("verbatim") is True, "data-carrying mrkdwn must be verbatim (no auto-linking)"
        for v in obj.values():
            out += _mrkdwn_texts(v)
    elif isinstance(obj, list):
        for v in obj:
            out += _mrkdwn_texts(v)
    return out


_ENTITY = re.compile(r"&(amp|lt|gt);")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def assert_safe_text(text: str, allow_newlines: bool = True) -> None:
    """No raw '<' or '>' (no mention, no link), every '&' starts an entity, no control character."""
    assert "<" not in text and ">" not in text, text[:200]
    assert len(_ENTITY.findall(text)) == text.count("&"), text[:200]
    body = text.replace("\n", "") if allow_newlines else text
    assert not _CONTROL.search(body), repr(text[:200])


def assert_safe_message(body: dict) -> None:
    assert block_errors(body["blocks"]) == [] if "blocks" in body else True
    json.loads(json.dumps(body, ensure_ascii=False))
    for t in _mrkdwn_texts(body.get("blocks", [])):
        assert_safe_text(t)
    assert_safe_text(body["text"], allow_newlines=False)
    for b in body.get("blocks", []):
        if b["type"] == "header":
            assert not _CONTROL.search(b["text"]["text"])


class _Threads(ThreadBook):
    def __init__(self) -> None:
        self.store = MemoryStore()

    def thread(self, uid: str, sink: str):  # type: ignore[no-untyped-def]
        return self.store.thread(uid, sink)

    def set_thread(self, uid: str, sink: str, ref) -> None:  # type: ignore[no-untyped-def]
        self.store.set_thread(uid, sink, ref)


def test_mentions_and_links_in_labels_reach_slack_inert() -> None:
    """Item 1: <!channel>, <!here>, <https://…|…> in labels and summaries are shown, not obeyed."""
    with fake_slack() as fake:
        s = load_settings(None, environ={}, overrides={
            "slack": {"bot_token": "xoxb-test", "channel": "C1", "api_url": fake.api_url, "webhook_url": fake.webhook_url},
            "prometheus": {"url": "http://prom.example:9090"}})
        inc = incident(job="<!channel>", instance="<https://evil.example|click me>", model="<!here>",
                       summary="usage high on <!channel> see <https://evil.example|click me> & more",
                       triage=("ping <@U012345>", "open <https://evil.example>"), cause="<!everyone>")
        threads = _Threads()
        bot, hook = SlackNotifier(s), SlackWebhookNotifier(s)
        for kind in (EventKind.FIRE, EventKind.UPDATE, EventKind.REMIND, EventKind.RESOLVE):
            bot.deliver(event(inc, kind), threads)
            hook.deliver(event(inc, kind), threads)
        assert fake.rejected == []
        sent = [c.body for c in fake.calls if c.method in ("chat.postMessage", "chat.update", "webhook")]
        assert len(sent) == 1 + 3 * 2 + 4
        for body in sent:
            assert_safe_message(body)
        parent = fake.of("chat.postMessage")[0].body
        shown = json.dumps(parent)
        assert "&lt;!channel&gt;" in shown and "&lt;https://evil.example|click me&gt;" in shown


def test_a_4000_character_model_name_is_delivered_within_limits() -> None:
    """Item 2: the 4,000-character model_name used to make a 4,173-character context element."""
    with fake_slack() as fake:
        s = load_settings(None, environ={}, overrides={
            "slack": {"bot_token": "xoxb-test", "channel": "C1", "api_url": fake.api_url},
            "links": {"grafana_url": "http://grafana.example"},
            "prometheus": {"url": "http://prom.example:9090"}})
        inc = incident(model="m" * 4000, instance="i" * 4000, summary="s" * 5000, triage=("t" * 4000,) * 12,
                       evidence=tuple(Evidence("kv_usage" * 300, "mean", 0.97, ">=", 0.9, "10m", True)
                                      for _ in range(14)))
        SlackNotifier(s).deliver(event(inc), _Threads())
        assert fake.rejected == []
        body = fake.of("chat.postMessage")[0].body
        ctx = next(b for b in body["blocks"] if b["type"] == "context")
        assert all(len(e["text"]) <= 3000 for e in ctx["elements"])
        assert any(e["text"].endswith("…") for e in ctx["elements"])


def test_the_fake_refuses_what_slack_refuses() -> None:
    """The validator is real: an over-long context element is refused as invalid_blocks."""
    bad = [{"type": "context", "elements": [{"type": "mrkdwn", "text": "x" * 4173}]}]
    assert block_errors(bad) and block_errors([{"type": "header", "text": {"type": "plain_text", "text": "h" * 151}}])
    assert block_errors([{"type": "section", "text": {"type": "mrkdwn", "text": "ok"}}] * 51)
    assert block_errors([{"type": "section", "fields": [{"type": "mrkdwn", "text": "f"}] * 11}])


def test_clip_never_cuts_inside_an_entity() -> None:
    for n in range(1, 12):
        text = blocks.esc("a" * n + "&<>" * 10)
        for limit in range(2, 30):
            out = blocks.clip(text, limit)
            assert blocks.slack_len(out) <= limit
            assert len(_ENTITY.findall(out)) == out.count("&")
    assert blocks.clip("🔥" * 100, 11) == "🔥" * 5 + "…"


label = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(HOSTILE)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=label, instance=label, model=label, summary=label, rule=label, cause=label,
       triage=st.lists(label, min_size=1, max_size=30), n_ev=st.integers(0, 15),
       kind=st.sampled_from(list(EventKind)), resolved=st.booleans())
def test_property_every_message_is_valid_and_inert(job: str, instance: str, model: str, summary: str, rule: str,
                                                   cause: str, triage: list[str], n_ev: int, kind: EventKind,
                                                   resolved: bool) -> None:
    """Random labels, summaries, triage and evidence: valid Block Kit, no mention, link or control char."""
    ev = tuple(Evidence(job or "s", model or "mean", 0.5, ">=", 0.9, instance, i % 2 == 0) for i in range(n_ev))
    inc = incident(job=job, instance=instance or "x", model=model, summary=summary, triage=tuple(triage),
                   rule_id=rule, cause=cause, evidence=ev,
                   state=IncidentState.RESOLVED if resolved else IncidentState.FIRING)
    long_url = "http://prom.example/graph?g0.expr=" + "x" * 3100
    for body_blocks in (blocks.parent_blocks(inc, T0, {"grafana": "http://g.example/d", "prometheus": long_url}),
                        blocks.webhook_blocks(event(inc, kind), {})):
        assert block_errors(body_blocks) == []
        assert_safe_message({"blocks": body_blocks, "text": blocks.fallback_text(event(inc, kind))})
    assert_safe_text(blocks.reply_text(event(inc, kind)), allow_newlines=False)
