"""Slack delivery with the real ``slack_sdk``: bot token (threads, status updates) or incoming webhook.

Bot mode: a ``fire`` posts the parent message (``chat.postMessage``) to the
routed channel and records its ``ts`` at once; ``update``/``remind``/``resolve``
first refresh the parent's status (``chat.update``, idempotent) and then reply
in its thread, so a retry after a failed reply never edits twice and a failure
before the reply never loses it. Webhook mode posts every event as its own
message. 429 is honoured in-process once (``Retry-After``); 500/503 are retried
with backoff; anything still failing raises :class:`DeliveryError` and the
outbox retries next cycle (with ``Retry-After`` as the earliest time).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)
from slack_sdk.http_retry.handler import RetryHandler
from slack_sdk.webhook import WebhookClient

from kvwatch.alerting.lifecycle import Event, EventKind, Incident
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
    """One honoured 429 (sleeps Retry-After), two 5xx retries with backoff, one connection retry."""
    return [
        RateLimitErrorRetryHandler(max_retry_count=1),
        ServerErrorRetryHandler(max_retry_count=2),
        ConnectionErrorRetryHandler(max_retry_count=1),
    ]


def route(cfg: SlackSettings, inc: Incident) -> str:
    """First route whose severity floor and label matchers fit, else the default channel."""
    labels = inc.label_map
    for r in cfg.routes:
        if inc.severity.rank >= Severity(r.min_severity).rank and all(labels.get(k) == v for k, v in r.match.items()):
            return r.channel
    return cfg.channel


def _error(sink: str, exc: Exception) -> DeliveryError:
    if isinstance(exc, SlackApiError):
        resp = exc.response
        retry = resp.headers.get("Retry-After") or resp.headers.get("retry-after")
        if isinstance(retry, list):
            retry = retry[0]
        err = resp.get("error") if isinstance(resp.data, dict) else None
        detail = f"HTTP {resp.status_code} {err or ''}".strip()
        return DeliveryError(sink, detail, float(retry) if retry else None)
    return DeliveryError(sink, f"{type(exc).__name__}: {exc}")


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

    def _links(self, inc: Incident, now: float) -> dict[str, str]:
        return {"grafana": grafana_url(self.settings, inc, now), "prometheus": prometheus_url(self.settings, inc, now)}

    def deliver(self, event: Event, threads: ThreadBook) -> None:
        try:
            self._deliver(event, threads)
        except (SlackApiError, SlackRequestError, OSError) as exc:
            raise _error(self.name, exc) from None

    def _deliver(self, event: Event, threads: ThreadBook) -> None:
        inc = event.incident
        parent = threads.thread(inc.uid, self.name)
        text = blocks.fallback_text(event)
        if event.kind is EventKind.FIRE or parent is None:
            # no parent yet (fire, or fire was silenced / lost its thread): this message becomes the parent
            channel = route(self.settings.slack, inc)
            resp = self.client.chat_postMessage(
                channel=channel,
                text=text,
                blocks=blocks.parent_blocks(inc, event.at, self._links(inc, event.at)),
                unfurl_links=False,
                metadata={"event_type": "kvwatch_incident", "event_payload": {"incident": inc.uid}},
            )
            ref = ThreadRef(str(resp.get("channel") or channel), str(resp["ts"]))
            threads.set_thread(inc.uid, self.name, ref)
            if event.kind is EventKind.FIRE:
                self._attach_chart(inc, event.at, ref)
                return
            parent = ref
        self.client.chat_update(
            channel=parent.channel,
            ts=parent.ts,
            text=text,
            blocks=blocks.parent_blocks(inc, event.at, self._links(inc, event.at)),
        )
        self.client.chat_postMessage(
            channel=parent.channel, thread_ts=parent.ts, text=blocks.reply_text(event), unfurl_links=False
        )
        if event.kind is EventKind.RESOLVE:
            self._attach_chart(inc, event.at, parent)

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
                    filename=f"kvwatch-{inc.key.mode.value}.png",
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
