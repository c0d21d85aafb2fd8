"""``kvwatch once --notify``: one evaluation through the same lifecycle, state and sinks as ``run``.

A condition that holds over its evaluation window counts as having met its
``for`` (``assume_held``): a single evaluation is all the evidence there is. The
state file makes repeated ``once --notify`` runs (e.g. from cron) behave like
cycles of ``run``: an ongoing incident is not announced twice.
"""

from __future__ import annotations

import logging
import sys
import time

from kvwatch.alerting.lifecycle import EventKind, Lifecycle
from kvwatch.alerting.sinks.outbox import drain
from kvwatch.alerting.state import ResilientStore
from kvwatch.config import Settings
from kvwatch.core.models import Evaluation
from kvwatch.service.wiring import make_alertmanager, make_notifiers

log = logging.getLogger("kvwatch.service")


def notify_once(settings: Settings, evaluation: Evaluation) -> None:
    """Track, persist and deliver; one summary line on stderr. Never raises for delivery problems."""
    store = ResilientStore(settings.state.path)
    try:
        now = evaluation.evaluated_at.timestamp()
        life = Lifecycle(settings.lifecycle)
        incidents, events = life.step(store.load(), evaluation.results, now, assume_held=True)
        notifiers = make_notifiers(settings)
        store.commit(incidents, [(sink, e) for e in events for sink in notifiers])
        am = make_alertmanager(settings)
        am_errors = [r for r in (am.sync(incidents.values(), now) if am else []) if not r.ok]
        report = drain(store, notifiers, time.time())
        fired = sum(e.kind is EventKind.FIRE for e in events)
        resolved = sum(e.kind is EventKind.RESOLVE for e in events)
        msg = (f"kvwatch: notify: {fired} fired, {resolved} resolved, {len(events)} events; "
               f"sent {report.sent}, failed {report.failed}, queued {store.pending()}")
        if am_errors:
            msg += f"; Alertmanager errors: {', '.join(r.url for r in am_errors)}"
        if report.errors:
            msg += f"; {report.errors[0]}"
        print(msg, file=sys.stderr)
    finally:
        store.close()
