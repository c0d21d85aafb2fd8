"""Drain the delivery outbox: each due item to its sink, in order per incident, failures kept for later.

A permanent failure (the sink says no retry can succeed) is dead-lettered: removed
from the outbox, counted (``outcome="dead"``) and logged once with the route and the
fix; the other incidents keep flowing. ``deadline`` (monotonic seconds) bounds the
drain: items not tried by then stay queued for the next cycle and are reported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kvwatch.alerting.sinks.base import DeliveryError, Notifier
from kvwatch.alerting.state import MemoryStore

log = logging.getLogger("kvwatch.alerting.sinks")

#: first retry after this many seconds, doubling per attempt up to MAX_BACKOFF_S
BASE_BACKOFF_S = 10.0
MAX_BACKOFF_S = 600.0


def backoff(attempts: int, retry_after: float | None) -> float:
    """Seconds until the next attempt: the sink's Retry-After if it gave one, else exponential."""
    if retry_after is not None:
        return max(0.0, retry_after)
    return min(MAX_BACKOFF_S, BASE_BACKOFF_S * 2 ** max(0, attempts - 1))


@dataclass
class DrainReport:
    sent: int = 0
    failed: int = 0
    deferred: int = 0
    dead: int = 0
    #: due items left for the next cycle because the delivery deadline passed
    overdue: int = 0
    errors: list[str] = field(default_factory=list)


def drain(
    store: MemoryStore,
    notifiers: Mapping[str, Notifier],
    now: float,
    *,
    on_result: Callable[[str, str], None] = lambda sink, outcome: None,
    deadline: float | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    hold: frozenset[str] = frozenset(),
) -> DrainReport:
    """Deliver every due item. An item waits while an earlier one of the same incident and sink is
    undelivered (a resolve never overtakes its fire). ``on_result(sink, "ok"|"error"|"dead")`` feeds metrics."""
    report = DrainReport()
    blocked: set[tuple[str, str]] = set()
    for item in store.due(float("inf")):
        lane = (item.sink, item.event.incident.uid)
        if lane in blocked or item.next_attempt_at > now or item.sink in hold:  # hold: an HA follower's sinks
            blocked.add(lane)
            report.deferred += 1
            continue
        if deadline is not None and monotonic() >= deadline:
            report.overdue += 1
            continue
        notifier = notifiers.get(item.sink)
        if notifier is None:
            log.warning("kvwatch: dropping %s for %s: sink %r is no longer configured",
                        item.event.kind.value, item.event.incident.key, item.sink)
            store.delivered(item.id)
            continue
        store.attempt(item.id)  # recorded before the call: a crash now means at-least-once, never lost
        try:
            notifier.deliver(item.event, store)
        except DeliveryError as exc:
            attempts = item.attempts + 1
            if exc.permanent:
                store.delivered(item.id)  # dead letter: retrying cannot help
                report.dead += 1
                on_result(item.sink, "dead")
                log.error("kvwatch: %s: giving up on %s of %s (%s): %s", item.sink, item.event.kind.value,
                          item.event.incident.key, exc.detail, exc.hint or "not retryable")
                continue
            store.failed(item.id, now + backoff(attempts, exc.retry_after), exc.detail)
            blocked.add(lane)
            report.failed += 1
            report.errors.append(f"{exc} (attempt {attempts})")
            on_result(item.sink, "error")
            continue
        store.delivered(item.id)
        report.sent += 1
        on_result(item.sink, "ok")
    return report
