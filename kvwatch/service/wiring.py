"""Build the edges from settings: the Prometheus client and the notification sinks."""

from __future__ import annotations

from collections.abc import Callable

from kvwatch.alerting.sinks.alertmanager import AlertmanagerSink
from kvwatch.alerting.sinks.base import Notifier
from kvwatch.alerting.sinks.console import ConsoleNotifier
from kvwatch.alerting.sinks.slack import ChartMaker, SlackNotifier, SlackWebhookNotifier
from kvwatch.config import Settings
from kvwatch.core.promclient import PromClient


def make_client(settings: Settings) -> PromClient:
    return PromClient.from_settings(settings.prometheus)


def make_notifiers(settings: Settings, chart: ChartMaker | None = None) -> dict[str, Notifier]:
    """Outbox sinks by name: Slack bot and/or webhook; the console when nothing else is configured."""
    out: dict[str, Notifier] = {}
    s = settings.slack
    if s.bot_token and s.channel:
        out["slack"] = SlackNotifier(settings, chart=chart)
    if s.webhook_url:
        out["slack-webhook"] = SlackWebhookNotifier(settings)
    if not out and not settings.alertmanager.urls:
        out["console"] = ConsoleNotifier()
    return out


def make_alertmanager(settings: Settings) -> AlertmanagerSink | None:
    return AlertmanagerSink(settings) if settings.alertmanager.urls else None


def make_chart(settings: Settings, client: PromClient) -> ChartMaker | None:
    """A chart renderer when ``slack.charts`` is on and matplotlib is installed."""
    if not settings.slack.charts:
        return None
    try:
        from kvwatch.alerting.sinks.chart import chart_maker
    except ImportError:
        return None
    maker: Callable[..., ChartMaker] = chart_maker
    return maker(settings, client)
