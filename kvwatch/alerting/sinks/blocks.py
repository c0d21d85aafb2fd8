"""Slack Block Kit for incidents: the parent message, its status and the thread replies.

Rendered from the same :class:`~kvwatch.alerting.lifecycle.Incident` (and so the same
``Diagnosis``) as the log line and the JSON. This module is the one place that
makes data safe for Slack:

* every value that carries data (labels, rule ids, rendered summaries and
  triage) is escaped with :func:`esc` before it enters mrkdwn or the fallback
  ``text`` (``&``, ``<``, ``>`` → entities, control characters → visible
  escapes), so a label ``<!channel>`` or ``<https://evil|click>`` is shown, not
  obeyed; mrkdwn objects are ``verbatim`` so bare URLs and ``#channels`` in data
  are not auto-linked;
* :func:`enforce` applies every Block Kit limit (:data:`LIMITS`) to a finished
  message, truncating with ``…`` without cutting an entity such as ``&amp;``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kvwatch.alerting.lifecycle import Event, EventKind, Incident, IncidentState
from kvwatch.core.models import FailureMode
from kvwatch.textsafe import ELLIPSIS, printable

Block = dict[str, Any]

#: Slack's Block Kit limits (characters, items), from the Block Kit reference
LIMITS = {
    "blocks": 50,  # blocks per message
    "text": 3000,  # section text, context element text, any text object
    "fallback": 3000,  # top-level `text` (Slack accepts more; notifications show far less)
    "header": 150,  # header block plain_text
    "fields": 10,  # fields per section
    "field": 2000,  # text of one section field
    "context_elements": 10,
    "actions_elements": 25,
    "button_text": 75,
    "url": 3000,
    "action_id": 255,
}
_ENTITY_MAX = len("&amp;")


def esc(text: object) -> str:
    """Data for mrkdwn or ``text``: control characters made visible, then ``& < >`` as entities."""
    return printable(str(text)).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_len(text: str) -> int:
    """Length as Slack counts it, conservatively: UTF-16 code units (an emoji may count 2)."""
    return len(text) if text.isascii() else len(text.encode("utf-16-le")) // 2


def clip(text: str, limit: int) -> str:
    """At most ``limit`` (UTF-16 units); a cut ends in ``…`` and never splits an entity like ``&amp;``."""
    if slack_len(text) <= limit:
        return text
    keep = limit - 1
    cut = text[:keep]
    if slack_len(cut) > keep:  # astral characters (most emoji) count 2 units
        units, end = 0, 0
        for end, ch in enumerate(cut):  # noqa: B007 - `end` is the first character that no longer fits
            units += 2 if ord(ch) > 0xFFFF else 1
            if units > keep:
                break
        cut = cut[:end]
    amp = cut.rfind("&", max(0, len(cut) - _ENTITY_MAX))
    if amp >= 0 and ";" not in cut[amp:]:
        cut = cut[:amp]  # the cut fell inside an entity: drop it whole
    return cut + ELLIPSIS


def md(text: str, limit: int = LIMITS["text"]) -> Block:
    """A mrkdwn text object; ``text`` must already be escaped (see :func:`esc`)."""
    return {"type": "mrkdwn", "text": clip(text, limit), "verbatim": True}


def plain(text: str, limit: int) -> Block:
    """A plain_text object of data: not parsed by Slack, but control characters are escaped."""
    return {"type": "plain_text", "text": clip(printable(text), limit), "emoji": True}


def _clip_obj(obj: Any, limit: int) -> Any:
    if isinstance(obj, dict) and isinstance(obj.get("text"), str):
        return {**obj, "text": clip(obj["text"], limit)}
    return obj


def enforce(blocks: list[Block]) -> list[Block]:
    """Every Block Kit limit applied to a finished message: a message Slack cannot reject for size.

    Texts are clipped, sections keep their first 10 fields and context blocks their
    first 10 elements, a button whose URL is too long is dropped (a truncated URL
    would be wrong), an actions block left empty is dropped, and the message keeps
    its first 50 blocks.
    """
    out: list[Block] = []
    for b in blocks[: LIMITS["blocks"]]:
        b = dict(b)
        kind = b.get("type")
        if kind == "header":
            b["text"] = _clip_obj(b.get("text"), LIMITS["header"])
        elif kind == "section":
            if "text" in b:
                b["text"] = _clip_obj(b["text"], LIMITS["text"])
            if "fields" in b:
                b["fields"] = [_clip_obj(f, LIMITS["field"]) for f in b["fields"][: LIMITS["fields"]]]
        elif kind == "context":
            b["elements"] = [_clip_obj(e, LIMITS["text"]) for e in b["elements"][: LIMITS["context_elements"]]]
        elif kind == "actions":
            buttons = [
                {**e, "text": _clip_obj(e.get("text"), LIMITS["button_text"])}
                for e in b["elements"][: LIMITS["actions_elements"]]
                if slack_len(str(e.get("url", ""))) <= LIMITS["url"]
                and slack_len(str(e.get("action_id", ""))) <= LIMITS["action_id"]
            ]
            if not buttons:
                continue
            b["elements"] = buttons
        out.append(b)
    return out

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
    """``MODE · severity · job/instance``, raw (not escaped, not clipped): escape where it is used."""
    target = f"{inc.key.job}/{inc.key.instance}" if inc.key.job else inc.key.instance
    return f"{inc.mode.value.upper()} · {inc.severity.value} · {target}"


def status_line(inc: Incident, now: float) -> str:
    if inc.state is IncidentState.RESOLVED:
        end = inc.resolved_at or now
        how = {"gone": "target gone from scraping", "expired": "no data for too long"}.get(inc.resolution, "cleared")
        return f":white_check_mark: *RESOLVED* after {human_duration(end - inc.started_at)} ({how}, {_clock(end)})"
    since = inc.fired_at or inc.started_at
    line = f":rotating_light: *FIRING* since {_clock(since)} ({human_duration(now - inc.started_at)} so far)"
    if inc.blind_since is not None:
        line += (f" · :see_no_evil: *BLIND* since {_clock(inc.blind_since)} ({esc(inc.blind_reason)}): "
                 "held open until the signals return")
    return line


def fallback_text(event: Event) -> str:
    inc = event.incident
    verb = {EventKind.FIRE: "", EventKind.UPDATE: "changed: ", EventKind.REMIND: "still firing: ",
            EventKind.RESOLVE: "resolved: ", EventKind.BLIND: "blind, held open: "}[event.kind]
    return clip(f"kvwatch {verb}{esc(title(inc))}: {esc(inc.summary)}", LIMITS["fallback"])


def evidence_fields(inc: Incident) -> list[Block]:
    out = []
    for e in inc.evidence[:10]:
        obs = "n/a" if e.observed is None else f"{'> ' if e.lower_bound else ''}{e.observed:.4g}"
        mark = "" if e.passed else " (not met)"
        op = esc(_OPS.get(e.op, e.op))
        text = f"*{esc(e.signal)}.{esc(e.stat)}*\nobserved {obs} · threshold {op} {e.threshold:g} over {esc(e.window)}{mark}"
        out.append(md(text, LIMITS["field"]))
    return out


def parent_blocks(inc: Incident, now: float, links: dict[str, str]) -> list[Block]:
    """Header, status, summary, evidence fields, ordered triage, context, link buttons."""
    blocks: list[Block] = [
        {"type": "header", "text": plain(title(inc), LIMITS["header"])},
        {"type": "section", "text": md(status_line(inc, now))},
        {"type": "section", "text": md(f"{ICON[inc.mode]} {esc(inc.summary)}")},
    ]
    others = [f for f in inc.findings if f.mode is not inc.mode]
    if others:
        also = "\n".join(f"{ICON[f.mode]} *{f.mode.value}* ({f.severity.value}): {esc(f.summary)}" for f in others)
        blocks.append({"type": "section", "text": md(f"*Also seen*\n{also}")})
    fields = evidence_fields(inc)
    if fields:
        blocks.append({"type": "section", "fields": fields})
    if inc.triage:
        steps = "\n".join(f"{i}. {esc(s)}" for i, s in enumerate(inc.triage, start=1))
        blocks.append({"type": "section", "text": md(f"*Triage, in order*\n{steps}")})
    labels = inc.label_map
    ctx = [f"confidence {inc.confidence:.0%}", f"rule `{esc(inc.rule_id)}`"]
    ctx += [f"{k} {esc(labels[k])}" for k in ("model", "engine") if labels.get(k)]
    if inc.cause:
        ctx.append(f"cause {esc(inc.cause)}")
    # one element per item: a huge label clips its own element, not the confidence next to it
    blocks.append({"type": "context", "elements": [md(c) for c in ctx]})
    buttons = [
        {"type": "button", "text": plain(name, LIMITS["button_text"]), "url": url, "action_id": f"kvwatch-{slug}"}
        for slug, name, url in (
            ("grafana", "Grafana dashboard", links.get("grafana", "")),
            ("prometheus", "Prometheus graph", links.get("prometheus", "")),
        )
        if url
    ]
    if buttons:
        blocks.append({"type": "actions", "elements": buttons})
    return enforce(blocks)


def reply_text(event: Event) -> str:
    """The thread reply for update / remind / resolve (and the body of webhook messages), escaped and clipped."""
    inc = event.incident
    if event.kind is EventKind.UPDATE:
        what = "; ".join(event.changes) or f"now {inc.mode.value} · {inc.severity.value}"
        text = f":arrows_counterclockwise: Changed: {esc(what)}. Now: {esc(inc.summary)}"
    elif event.kind is EventKind.REMIND:
        text = f":alarm_clock: Still firing after {human_duration(event.at - inc.started_at)}: {esc(inc.summary)}"
    elif event.kind is EventKind.RESOLVE:
        text = status_line(inc, event.at)
    elif event.kind is EventKind.BLIND:
        text = (f":see_no_evil: Signals lost ({esc(inc.blind_reason)}): kvwatch cannot decide {inc.mode.value} "
                "any more, so this incident stays open until they return.")
    else:
        text = f"{ICON[inc.mode]} {esc(title(inc))}: {esc(inc.summary)}"
    return clip(text, LIMITS["fallback"])


def webhook_blocks(event: Event, links: dict[str, str]) -> list[Block]:
    """Webhooks have no threads: a fire is the full message, the rest one line with the title."""
    if event.kind is EventKind.FIRE:
        return parent_blocks(event.incident, event.at, links)
    head = {"type": "section", "text": md(f"*{esc(title(event.incident))}*\n{reply_text(event)}")}
    return enforce([head])
