"""Slack delivery with the real ``slack_sdk``: bot token (threads, status updates) or incoming webhook.

Bot mode, one thread per engine episode: a ``fire`` posts the parent message
(``chat.postMessage``, with Slack message ``metadata`` naming the engine and the
episode) and records its ``ts``; ``update``/``remind``/``resolve`` refresh the
parent in place (``chat.update``, idempotent) and reply in its thread; a resolve
as *gone* only refreshes the parent (a rollout pages nobody).

Idempotent posting: before any parent is posted, the channel history is read
(``conversations.history`` with metadata) for a parent of the same engine that
is still open or belongs to this episode. It is adopted instead of posting a
second one: this covers a crash between ``chat.postMessage`` and recording its
``ts``, and a state file that was lost or quarantined. Charts are uploaded only
after the parent is recorded, outside that window.

Errors: 429 raises at once with Slack's ``Retry-After`` (the outbox defers that
incident's lane; nothing sleeps inside a cycle); 5xx and connection errors are
retried once in-process. Permanent errors (``channel_not_found``,
``not_in_channel``, ``invalid_blocks``, ``message_not_found``, auth and scope
errors) raise a :class:`DeliveryError` marked permanent: the outbox dead-letters
the message with one log line naming the route and the fix.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    ServerErrorRetryHandler,
)
from slack_sdk.http_retry.handler import RetryHandler
from slack_sdk.webhook import WebhookClient

from kvwatch.alerting.lifecycle import Event, EventKind, Incident, IncidentState
from kvwatch.alerting.sinks import blocks
from kvwatch.alerting.sinks.base import DeliveryError, ThreadBook
from kvwatch.alerting.sinks.links import grafana_url, prometheus_url
from kvwatch.alerting.state import ThreadRef
from kvwatch.config import Settings, SlackSettings
from kvwatch.core.models import Severity
from kvwatch.textsafe import printable

log = logging.getLogger("kvwatch.alerting.sinks.slack")

#: renders a PNG chart of an incident, or None (see :mod:`kvwatch.alerting.sinks.chart`)
ChartMaker = Callable[[Incident, float], bytes | None]


def retry_handlers() -> list[RetryHandler]:
    """One 5xx retry and one connection retry. No 429 handler: sleeping out a Retry-After inside a
    cycle would block it; the outbox defers the message instead."""
    return [
        ServerErrorRetryHandler(max_retry_count=1),
        ConnectionErrorRetryHandler(max_retry_count=1),
    ]


#: Slack error codes that no retry fixes, with what the operator has to do
PERMANENT: dict[str, str] = {
    "channel_not_found": "check the channel name/id in slack.channel or slack.routes",
    "not_in_channel": "invite the kvwatch bot to the channel (/invite @kvwatch)",
    "is_archived": "unarchive the channel or route to another one",
    "invalid_blocks": "report a kvwatch bug: the message was rejected as malformed",
    "invalid_blocks_format": "report a kvwatch bug: the message was rejected as malformed",
    "msg_too_long": "report a kvwatch bug: the message exceeds Slack's limits",
    "message_not_found": "the parent message was deleted; the incident's next message starts a new thread",
    "invalid_auth": "check SLACK_BOT_TOKEN",
    "not_authed": "check SLACK_BOT_TOKEN",
    "token_revoked": "issue a new bot token",
    "account_inactive": "issue a new bot token",
    "missing_scope": "add the bot scopes chat:write, channels:history, channels:read (see docs/alerting.md)",
}

#: pages of 200 messages searched for an existing parent before posting one
HISTORY_PAGES = 5

#: metadata ``event_type`` of kvwatch parent messages
EVENT_TYPE = "kvwatch_incident"


def route(cfg: SlackSettings, inc: Incident) -> str:
    """First route whose severity floor and label matchers fit, else the default channel."""
    labels = inc.label_map
    for r in cfg.routes:
        if inc.severity.rank >= Severity(r.min_severity).rank and all(labels.get(k) == v for k, v in r.match.items()):
            return r.channel
    return cfg.channel


def _error(sink: str, exc: Exception, channel: str = "") -> DeliveryError:
    if isinstance(exc, SlackApiError):
        resp = exc.response
        retry = resp.headers.get("Retry-After") or resp.headers.get("retry-after")
        if isinstance(retry, list):
            retry = retry[0]
        err = resp.get("error") if isinstance(resp.data, dict) else None
        detail = f"HTTP {resp.status_code} {err or ''}".strip()
        fix = PERMANENT.get(str(err or ""))
        if fix is not None:
            return DeliveryError(sink, detail, None, permanent=True,
                                 hint=f"route {channel or '?'}: {err}: {fix}")
        return DeliveryError(sink, detail, float(retry) if retry else None)
    return DeliveryError(sink, f"{type(exc).__name__}: {exc}")


def metadata(inc: Incident) -> dict[str, Any]:
    """Slack message metadata of a parent: enough to find the thread again without local state."""
    state = "resolved" if inc.state is IncidentState.RESOLVED else "open"
    payload = {"incident": inc.uid, "job": inc.key.job, "instance": inc.key.instance, "state": state}
    return {"event_type": EVENT_TYPE, "event_payload": payload}


class SlackNotifier:
    """Bot-token mode. ``client`` is injectable; by default a ``WebClient`` on ``slack.api_url``."""

    name = "slack"

    def __init__(
        self, settings: Settings, client: WebClient | None = None, chart: ChartMaker | None = None
    ) -> None:
        cfg = settings.slack
        self.settings = settings
        token = cfg.bot_token.get_secret_value() if cfg.bot_token else None
        self.client = client or WebClient(
            token=token, base_url=cfg.api_url, timeout=int(max(1, cfg.timeout)), retry_handlers=retry_handlers()
        )
        self.chart = chart
        self._ids: dict[str, str] = {}
        self._lookup_warned = False

    def _links(self, inc: Incident, now: float) -> dict[str, str]:
        return {"grafana": grafana_url(self.settings, inc, now), "prometheus": prometheus_url(self.settings, inc, now)}

    def deliver(self, event: Event, threads: ThreadBook) -> None:
        channel = route(self.settings.slack, event.incident)
        try:
            self._deliver(event, threads, channel)
        except (SlackApiError, SlackRequestError, OSError) as exc:
            raise _error(self.name, exc, channel) from None

    def _deliver(self, event: Event, threads: ThreadBook, channel: str) -> None:
        inc = event.incident
        parent = threads.thread(inc.uid, self.name) or self._find_parent(inc, channel)
        text = blocks.fallback_text(event)
        if parent is None:
            # no parent yet (fire, or fire was silenced / lost its thread): this message becomes the parent
            resp = self.client.chat_postMessage(
                channel=channel,
                text=text,
                blocks=blocks.parent_blocks(inc, event.at, self._links(inc, event.at)),
                unfurl_links=False,
                metadata=metadata(inc),
            )
            ref = ThreadRef(str(resp.get("channel") or channel), str(resp["ts"]))
            threads.set_thread(inc.uid, self.name, ref)
            if event.kind is EventKind.FIRE:
                self._attach_chart(inc, event.at, ref)
                return
            parent = ref
        else:
            threads.set_thread(inc.uid, self.name, parent)
        self.client.chat_update(
            channel=parent.channel,
            ts=parent.ts,
            text=text,
            blocks=blocks.parent_blocks(inc, event.at, self._links(inc, event.at)),
            metadata=metadata(inc),
        )
        if event.kind is EventKind.FIRE or (event.kind is EventKind.RESOLVE and inc.resolution == "gone"):
            return  # an adopted parent is refreshed in place; a gone target resolves quietly
        self.client.chat_postMessage(
            channel=parent.channel, thread_ts=parent.ts, text=blocks.reply_text(event), unfurl_links=False
        )
        if event.kind is EventKind.RESOLVE:
            self._attach_chart(inc, event.at, parent)

    def _channel_id(self, channel: str) -> str | None:
        """``conversations.history`` wants an id: names are resolved once via ``conversations.list``."""
        if not channel.startswith("#"):
            return channel
        if channel in self._ids:
            return self._ids[channel]
        cursor = None
        for _ in range(20):
            resp = self.client.conversations_list(types="public_channel,private_channel", exclude_archived=True,
                                                  limit=1000, cursor=cursor)
            for ch in resp.get("channels") or []:
                self._ids["#" + str(ch.get("name"))] = str(ch.get("id"))
            cursor = (resp.get("response_metadata") or {}).get("next_cursor")
            if channel in self._ids or not cursor:
                break
        return self._ids.get(channel)

    def _find_parent(self, inc: Incident, channel: str) -> ThreadRef | None:
        """A parent already in Slack for this episode, or an open one for this engine (newest first).

        A lookup that fails for lack of scopes is logged once and skipped (at-least-once then)."""
        try:
            cid = self._channel_id(channel)
            if cid is None:
                return None
            cursor = None
            for _ in range(HISTORY_PAGES):  # newest first: the last HISTORY_PAGES * 200 messages
                resp = self.client.conversations_history(channel=cid, include_all_metadata=True, limit=200,
                                                         cursor=cursor)
                for msg in resp.get("messages") or []:
                    meta = msg.get("metadata") or {}
                    p = meta.get("event_payload") or {}
                    if meta.get("event_type") != EVENT_TYPE or msg.get("thread_ts") not in (None, msg.get("ts")):
                        continue
                    if (p.get("job"), p.get("instance")) != (inc.key.job, inc.key.instance):
                        continue
                    if p.get("incident") == inc.uid or p.get("state") == "open":
                        return ThreadRef(cid, str(msg["ts"]))
                cursor = (resp.get("response_metadata") or {}).get("next_cursor")
                if not cursor:
                    return None
        except SlackApiError as exc:
            err = exc.response.get("error") if isinstance(exc.response.data, dict) else exc
            if err in PERMANENT and err not in ("channel_not_found", "not_in_channel"):
                if not self._lookup_warned:
                    self._lookup_warned = True
                    log.warning("kvwatch: slack: cannot look up existing threads in %s (%s): %s; posting without "
                                "the duplicate check", channel, err, PERMANENT[str(err)])
                return None
            raise
        return None

    def sweep(self, clear: set[tuple[str, str]], now: float) -> int:
        """Resolve open parents of engines in ``clear`` (evaluated, nothing matching, no incident known).

        After a restart without usable state (lost, quarantined, unwritable) an engine whose
        condition cleared while kvwatch was down would leave its thread *FIRING* forever. Only
        engines this process evaluated are touched (shards never resolve each other's threads).
        Returns the number of threads resolved; raises like :meth:`deliver`."""
        done = 0
        channels = dict.fromkeys([self.settings.slack.channel, *(r.channel for r in self.settings.slack.routes)])
        try:
            for channel in channels:
                cid = self._channel_id(channel) if channel else None
                if cid is None:
                    continue
                resp = self.client.conversations_history(channel=cid, include_all_metadata=True, limit=200)
                for msg in resp.get("messages") or []:
                    meta = msg.get("metadata") or {}
                    p = (meta.get("event_type") == EVENT_TYPE and meta.get("event_payload")) or {}
                    if p.get("state") != "open" or (p.get("job"), p.get("instance")) not in clear:
                        continue
                    self._close(cid, msg, p, now)
                    done += 1
        except (SlackApiError, SlackRequestError, OSError) as exc:
            raise _error(self.name, exc) from None
        return done

    def _close(self, channel: str, msg: dict[str, Any], payload: dict[str, Any], now: float) -> None:
        line = (":white_check_mark: *RESOLVED* (the condition had cleared while kvwatch was restarting "
                "without its state)")
        old = msg.get("blocks") or []
        new = [{"type": "section", "text": {"type": "mrkdwn", "text": line}}
               if "*FIRING" in str(b.get("text", "")) else b for b in old] or None
        meta = {"event_type": EVENT_TYPE, "event_payload": {**payload, "state": "resolved"}}
        text = f"kvwatch resolved: {msg.get('text', '')}"[:3000]
        self.client.chat_update(channel=channel, ts=str(msg["ts"]), text=text, blocks=new, metadata=meta)
        self.client.chat_postMessage(channel=channel, thread_ts=str(msg["ts"]), text=line, unfurl_links=False)

    def _attach_chart(self, inc: Incident, now: float, ref: ThreadRef) -> None:
        """Best effort: a chart that fails to render or upload never blocks the alert."""
        if self.chart is None or not self.settings.slack.charts:
            return
        try:
            png = self.chart(inc, now)
            if png:
                self.client.files_upload_v2(
                    channel=ref.channel,
                    thread_ts=ref.ts,
                    content=png,
                    filename=f"kvwatch-{inc.mode.value}.png",
                    title=blocks.clip(printable(f"{blocks.title(inc)}: KV usage, waiting, preemptions"), 250),
                )
        except Exception as exc:  # charts are decoration: log one line and move on
            log.warning("kvwatch: chart for %s not attached: %s", printable(str(inc.key)), exc)


class SlackWebhookNotifier:
    """Incoming-webhook mode: one message per event, no threads or edits (webhooks cannot)."""

    name = "slack-webhook"

    def __init__(self, settings: Settings, client: WebhookClient | None = None) -> None:
        cfg = settings.slack
        self.settings = settings
        url = cfg.webhook_url.get_secret_value() if cfg.webhook_url else ""
        self.client = client or WebhookClient(url, timeout=int(max(1, cfg.timeout)), retry_handlers=retry_handlers())

    def deliver(self, event: Event, threads: ThreadBook) -> None:
        inc = event.incident
        links = {"grafana": grafana_url(self.settings, inc, event.at), "prometheus": prometheus_url(self.settings, inc, event.at)}
        try:
            resp = self.client.send(text=blocks.fallback_text(event), blocks=blocks.webhook_blocks(event, links))
        except (SlackRequestError, OSError) as exc:
            raise DeliveryError(self.name, f"{type(exc).__name__}: {exc}") from None
        if resp.status_code != 200:
            retry: Any = resp.headers.get("Retry-After") or resp.headers.get("retry-after")
            if isinstance(retry, list):
                retry = retry[0]
            raise DeliveryError(self.name, f"HTTP {resp.status_code} {resp.body[:200]}", float(retry) if retry else None)
