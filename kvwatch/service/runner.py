"""The long-running process: APScheduler interval job, signals, config reload, HTTP endpoints.

SIGTERM/SIGINT: stop scheduling, wait up to ``STOP_GRACE_S`` for a running cycle,
close the state file and exit 0; a cycle still stuck on the network after that is
abandoned (its SQLite transaction, if any, rolls back). SIGHUP: reload config and
rules; an invalid file keeps the last good config (logged and counted).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import FrameType

from apscheduler.schedulers.background import BackgroundScheduler

from kvwatch.alerting.state import MemoryStore, ResilientStore
from kvwatch.config import Settings
from kvwatch.core.pipeline import evaluate
from kvwatch.core.rules import RuleSet
from kvwatch.errors import KvwatchError
from kvwatch.service.cycle import Service
from kvwatch.service.ha import Lease
from kvwatch.service.incremental import IncrementalEvaluator
from kvwatch.service.selfmetrics import SelfMetrics
from kvwatch.service.wiring import make_alertmanager, make_chart, make_client, make_notifiers

log = logging.getLogger("kvwatch.service")

STOP_GRACE_S = 5.0


@dataclass
class RunOptions:
    dry_run: bool = False
    once: bool = False


def build_service(settings: Settings, rules: RuleSet, opts: RunOptions, metrics: SelfMetrics) -> Service:
    client = make_client(settings)
    store: MemoryStore
    if opts.dry_run:
        store = MemoryStore()  # a dry run writes nothing, not even state
    else:
        store = ResilientStore(settings.state.path, on_error=lambda _msg: metrics.state_errors.inc())
    return Service(
        settings=settings,
        rules=rules,
        client=client,
        store=store,
        notifiers=make_notifiers(settings, make_chart(settings, client)),
        metrics=metrics,
        alertmanager=make_alertmanager(settings),
        dry_run=opts.dry_run,
        # keeps the window between cycles; falls back to a full fetch whenever it must
        evaluator=IncrementalEvaluator() if settings.evaluation.incremental else evaluate,
        lease=make_lease(settings),
    )


def make_lease(settings: Settings) -> Lease | None:
    ha = settings.ha
    if not ha.replica:
        return None
    return Lease(ha.replica, ha.selector, ha.lease or 3 * settings.evaluation.interval)


class Runner:
    """Owns the scheduler and the signal flags; ``loader`` re-reads config + rules for SIGHUP."""

    def __init__(self, service: Service, loader: Callable[[], tuple[Settings, RuleSet]]) -> None:
        self.service = service
        self.loader = loader
        self.stop = threading.Event()
        self.reload = threading.Event()
        self.scheduler = BackgroundScheduler(timezone=UTC)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self.reload.set()
        else:
            self.stop.set()

    def install_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _schedule(self) -> None:
        interval = self.service.settings.evaluation.interval
        self.scheduler.add_job(
            self.service.cycle,
            "interval",
            id="cycle",
            seconds=interval,
            max_instances=1,
            coalesce=True,
            jitter=min(5.0, interval * 0.05),
            next_run_time=datetime.now(tz=UTC),
            replace_existing=True,
            misfire_grace_time=max(1, int(interval)),
        )

    def do_reload(self) -> None:
        try:
            settings, rules = self.loader()
        except KvwatchError as exc:
            self.service.metrics.config_reload_errors.inc()
            log.error("kvwatch: config reload rejected, keeping the last good config: %s", exc)
            return
        old = self.service.settings
        chart = make_chart(settings, self.service.client)  # type: ignore[arg-type]
        self.service.reconfigure(settings, rules, make_notifiers(settings, chart), make_alertmanager(settings))
        if settings.evaluation.interval != old.evaluation.interval:
            self._schedule()
        if (settings.server, settings.state, settings.prometheus) != (old.server, old.state, old.prometheus):
            log.warning("kvwatch: server, state and prometheus settings take effect after a restart")
        log.info("kvwatch: config reloaded (%d rules)", len(rules.rules))

    def run_forever(self) -> int:
        self._schedule()
        self.scheduler.start()
        try:
            while not self.stop.wait(0.2):
                if self.reload.is_set():
                    self.reload.clear()
                    self.do_reload()
        finally:
            self.scheduler.shutdown(wait=False)
        return self.shutdown()

    def shutdown(self) -> int:
        """Wait briefly for a running cycle, close state, exit 0 (abandon a cycle stuck on I/O)."""
        got = self.service.running.acquire(timeout=STOP_GRACE_S)
        store = self.service.store
        if got:
            if isinstance(store, ResilientStore):
                store.close()
            log.info("kvwatch: stopped")
            return 0
        log.warning("kvwatch: abandoning the cycle in progress after %.0fs", STOP_GRACE_S)
        logging.shutdown()
        os._exit(0)  # the worker thread is blocked on the network; state is transactional


def wait_ready_age(settings: Settings) -> float:
    """/readyz is ready while the last good cycle is younger than three intervals (min 60 s)."""
    return max(60.0, 3 * settings.evaluation.interval)
