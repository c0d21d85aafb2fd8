"""The seam between the lifecycle and the sinks."""

from __future__ import annotations

from typing import Protocol

from kvwatch.alerting.lifecycle import Event
from kvwatch.alerting.state import ThreadRef
from kvwatch.redact import scrub


class DeliveryError(Exception):
    """A message was not delivered. ``retry_after`` (seconds) when the sink said when to retry;
    ``permanent`` when no retry can succeed (``hint`` then names the route and the fix)."""

    def __init__(self, sink: str, detail: str, retry_after: float | None = None, *, permanent: bool = False,
                 hint: str = "") -> None:
        self.sink = sink
        self.detail = scrub(detail)  # library errors may quote the webhook URL or a token
        self.retry_after = retry_after
        self.permanent = permanent
        self.hint = hint
        super().__init__(f"{sink}: {self.detail}")


class ThreadBook(Protocol):
    """Where a sink remembers the parent message of an incident (the state store)."""

    def thread(self, uid: str, sink: str) -> ThreadRef | None: ...

    def set_thread(self, uid: str, sink: str, ref: ThreadRef) -> None: ...


class Notifier(Protocol):
    """Delivers one event. Raises :class:`DeliveryError`; the outbox retries next cycle."""

    name: str

    def deliver(self, event: Event, threads: ThreadBook) -> None: ...
