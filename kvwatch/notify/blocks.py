"""Slack Block Kit for incidents: the parent message, its status and the thread replies.

Rendered from the same :class:`~kvwatch.lifecycle.Incident` (and so the same
``Diagnosis``) as the log line and the JSON. Slack limits respected: header
≤ 150 chars, ≤ 10 section fields, text ≤ 3000 chars.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kvwatch.lifecycle import Event, EventKind, Incident, IncidentState
from kvwatch.models import FailureMode

Block = dict[str, Any]

ICON = {
    FailureMode.FULL: ":red_circle:",
    FailureMode.OSCILLATING: ":large_orange_circle:",
    FailureMode.FRAGMENTED: ":large_orange_circle:",
    FailureMode.MISREAD: ":large_yellow_circle:",
    FailureMode.IDLE: ":large_blue_circle:",
    FailureMode.HEALTHY: ":large_green_circle:",
    FailureMode.UNKNOWN: ":white_circle:",
}
_OPS = {">=": "≥", "<=": "≤", ">": ">", "<": "<", "==": "="}


def human_duration(seconds: float) -> str:
    """12m, 1h05m, 2d3h: for on-call eyes, not for parsing."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    m, h, d = s // 60, s // 3600, s // 86400
    if h == 0:
        return f"{m}m"
    if d == 0:
        return f"{h}h{m % 60:02d}m"
    return f"{d}d{h % 24}h"


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def title(inc: Incident) -> str:
    target = f"{inc.key.job}/{inc.key.instance}" if inc.key.job else inc.key.instance
    return f"{inc.key.mode.value.upper()} · {inc.severity.value} · {target}"[:150]


def status_line(inc: Incident, now: float) -> str:
    if inc.state is IncidentState.RESOLVED:
        end = inc.resolved_at or now
        how = "target gone (no data)" if inc.resolution == "gone" else "cleared"
        return f":white_check_mark: *RESOLVED* after {human_duration(end - inc.started_at)} ({how}, {_clock(end)})"
    since = inc.fired_at or inc.started_at
    return f":rotating_light: *FIRING* since {_clock(since)} ({human_duration(now - inc.started_at)} so far)"


def fallback_text(event: Event) -> str:
    inc = event.incident
    verb = {EventKind.FIRE: "", EventKind.UPDATE: "escalated: ", EventKind.REMIND: "still firing: ",
            EventKind.RESOLVE: "resolved: "}[event.kind]
    return f"kvwatch {verb}{title(inc)}: {inc.summary}"[:3000]


def evidence_fields(inc: Incident) -> list[Block]:
    out = []
    for e in inc.evidence[:10]:
        obs = "n/a" if e.observed is None else f"{e.observed:.4g}"
        mark = "" if e.passed else " (not met)"
        text = f"*{e.signal}.{e.stat}*\nobserved {obs} · threshold {_OPS.get(e.op, e.op)} {e.threshold:g} over {e.window}{mark}"
        out.append({"type": "mrkdwn", "text": text[:2000]})
    return out


def parent_blocks(inc: Incident, now: float, links: dict[str, str]) -> list[Block]:
    """Header, status, summary, evidence fields, ordered triage, context, link buttons."""
    blocks: list[Block] = [
        {"type": "header", "text": {"type": "plain_text", "text": title(inc), "emoji": True}},
        {"type": "section", "text": {"type": "mrkdwn", "text": status_line(inc, now)}},
        {"type": "section", "text": {"type": "mrkdwn", "text": f"{ICON[inc.key.mode]} {inc.summary}"[:3000]}},
    ]
    fields = evidence_fields(inc)
    if fields:
        blocks.append({"type": "section", "fields": fields})
    if inc.triage:
        steps = "\n".join(f"{i}. {s}" for i, s in enumerate(inc.triage, start=1))
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"*Triage, in order*\n{steps}"[:3000]}})
    labels = inc.label_map
    ctx = [f"confidence {inc.confidence:.0%}", f"rule `{inc.rule_id}`"]
    ctx += [f"{k} {labels[k]}" for k in ("model", "engine") if labels.get(k)]
    if inc.cause:
        ctx.append(f"cause {inc.cause}")
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(ctx)}]})
    buttons = [
        {"type": "button", "text": {"type": "plain_text", "text": name}, "url": url, "action_id": f"kvwatch-{slug}"}
        for slug, name, url in (
            ("grafana", "Grafana dashboard", links.get("grafana", "")),
            ("prometheus", "Prometheus graph", links.get("prometheus", "")),
        )
        if url
    ]
    if buttons:
        blocks.append({"type": "actions", "elements": buttons})
    return blocks


def reply_text(event: Event) -> str:
    """The thread reply for update / remind / resolve (and the body of webhook messages)."""
    inc = event.incident
    if event.kind is EventKind.UPDATE:
        was = event.previous_severity.value if event.previous_severity else "?"
        return f":arrow_up: Escalated to *{inc.severity.value}* (was {was}): {inc.summary}"
    if event.kind is EventKind.REMIND:
        return f":alarm_clock: Still firing after {human_duration(event.at - inc.started_at)}: {inc.summary}"
    if event.kind is EventKind.RESOLVE:
        return status_line(inc, event.at)
    return f"{ICON[inc.key.mode]} {title(inc)}: {inc.summary}"


def webhook_blocks(event: Event, links: dict[str, str]) -> list[Block]:
    """Webhooks have no threads: a fire is the full message, the rest one line with the title."""
    if event.kind is EventKind.FIRE:
        return parent_blocks(event.incident, event.at, links)
    head = {"type": "section", "text": {"type": "mrkdwn", "text": f"*{title(event.incident)}*\n{reply_text(event)}"[:3000]}}
    return [head]
