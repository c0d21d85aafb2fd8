"""One log line per event: the sink of last resort when neither Slack nor Alertmanager is set up."""

from __future__ import annotations

import logging

from kvwatch.alerting.lifecycle import Event
from kvwatch.alerting.sinks.base import ThreadBook
from kvwatch.textsafe import printable

log = logging.getLogger("kvwatch.alerts")


def event_line(event: Event) -> str:
    inc = event.incident
    first = inc.triage[0] if inc.triage else ""
    line = (f"kvwatch alert {event.kind.value} mode={inc.mode.value} severity={inc.severity.value} "
            f"target={inc.key.job}/{inc.key.instance} rule={inc.rule_id}: {inc.summary}")
    out = f"{line} | first: {first}" if first and event.kind.value == "fire" else line
    return printable(out)  # one event, one line: a newline in a label cannot forge another


class ConsoleNotifier:
    name = "console"

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or log

    def deliver(self, event: Event, threads: ThreadBook) -> None:
        self.log.warning("%s", event_line(event))
