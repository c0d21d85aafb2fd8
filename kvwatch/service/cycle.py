"""One service cycle: evaluate → lifecycle → persist → Alertmanager → drain the outbox → metrics.

A cycle never raises: any failure is logged as one line, counted, and the next
cycle runs. Exactly one summary line per cycle is logged.

Deadlines keep a cycle inside its interval (together 85 % of it), so the scheduler never skips one:
evaluation gets ``EVAL_SHARE`` of the interval (it runs on a worker thread; one
that overruns is abandoned, its result discarded, and no new one starts while it
still runs), delivery gets ``DELIVERY_SHARE`` (items not tried stay queued). The
summary line says what was dropped.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kvwatch.alerting.lifecycle import EventKind, Lifecycle, findings_of
from kvwatch.alerting.sinks.alertmanager import AlertmanagerSink
from kvwatch.alerting.sinks.base import DeliveryError, Notifier
from kvwatch.alerting.sinks.console import event_line
from kvwatch.alerting.sinks.outbox import drain
from kvwatch.alerting.state import MemoryStore
from kvwatch.config import Settings
from kvwatch.core.models import Evaluation, FailureMode
from kvwatch.core.pipeline import evaluate
from kvwatch.core.promclient import QueryClient
from kvwatch.core.rules import RuleSet
from kvwatch.errors import KvwatchError
from kvwatch.service.ha import LEADER_SINKS, Lease
from kvwatch.service.selfmetrics import SelfMetrics

log = logging.getLogger("kvwatch.service")

#: shares of the evaluation interval given to evaluation and to delivery (the rest is slack)
EVAL_SHARE = 0.7
DELIVERY_SHARE = 0.15


def aligned(now: float, step_s: float) -> datetime:
    """The evaluation instant: ``now`` rounded down to a multiple of the step.

    Every range query then starts and ends on the step grid, so a cycle is
    reproducible (``kvwatch once --at`` with that instant gives the same data) and
    the results caches of Thanos/Mimir query frontends and VictoriaMetrics hit.
    """
    at = math.floor(now / step_s) * step_s if step_s > 0 else now
    return datetime.fromtimestamp(at, tz=UTC)


class _Dropped(Exception):
    """A stage was dropped because of its deadline; the message names it."""


@dataclass
class CycleReport:
    ok: bool
    duration_s: float
    states: dict[str, int] = field(default_factory=dict)
    fired: int = 0
    resolved: int = 0
    open: int = 0
    sent: int = 0
    failed: int = 0
    queued: int = 0
    queries: int = 0
    dead: int = 0
    delivery_error: str = ""
    #: what this cycle left undone because of a deadline, in words
    dropped: list[str] = field(default_factory=list)
    error: str = ""

    def line(self, dry_run: bool = False) -> str:
        states = ", ".join(f"{k} {v}" for k, v in sorted(self.states.items()) if v) or "none"
        head = f"kvwatch cycle {'ok' if self.ok else 'error'}{' (dry-run)' if dry_run else ''} in {self.duration_s:.2f}s"
        body = (f"targets: {sum(self.states.values())} ({states}); incidents: fired {self.fired}, "
                f"resolved {self.resolved}, open {self.open}; notifications: sent {self.sent}, failed {self.failed}, "
                f"queued {self.queued}{f', dead {self.dead}' if self.dead else ''}; queries {self.queries}")
        tail = f"; dropped: {', '.join(self.dropped)}" if self.dropped else ""
        if self.delivery_error:
            tail += f"; last delivery error (will retry): {self.delivery_error}"
        return f"{head}: {body}{tail}" + (f"; error: {self.error}" if self.error else "")


@dataclass
class Service:
    """Everything a cycle needs, injected. ``clock`` returns Unix seconds."""

    settings: Settings
    rules: RuleSet
    client: QueryClient
    store: MemoryStore
    notifiers: Mapping[str, Notifier]
    metrics: SelfMetrics
    alertmanager: AlertmanagerSink | None = None
    clock: Callable[[], float] = time.time
    dry_run: bool = False
    #: HA pair: only the lease's leader posts to Slack (None: this replica always does)
    lease: Lease | None = None
    #: the pipeline; injectable so the service is tested without Prometheus
    evaluator: Callable[[QueryClient, Settings, RuleSet, datetime], Evaluation] = evaluate
    lifecycle: Lifecycle = field(init=False)
    last_ok_at: float | None = None
    last_report: CycleReport | None = None
    running: threading.Lock = field(default_factory=threading.Lock)
    _worker: threading.Thread | None = field(default=None, init=False, repr=False)
    #: engines evaluated as clear (or gone) with no incident, at the last evaluation
    _clear: set[tuple[str, str]] | None = field(default=None, init=False, repr=False)
    #: open Slack threads of such engines were resolved once after start
    _swept: bool = field(default=False, init=False, repr=False)
    #: the evaluation's notes last logged (logged again only when they change)
    _notes: tuple[str, ...] = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        self.lifecycle = Lifecycle(self.settings.lifecycle)

    def reconfigure(self, settings: Settings, rules: RuleSet, notifiers: Mapping[str, Notifier],
                    alertmanager: AlertmanagerSink | None) -> None:
        with self.running:
            self.settings, self.rules, self.notifiers, self.alertmanager = settings, rules, notifiers, alertmanager
            self.lifecycle = Lifecycle(settings.lifecycle)

    def cycle(self) -> CycleReport:
        """Run one cycle under the lock (so shutdown can wait for it)."""
        with self.running:
            return self._cycle()

    def _queries(self) -> tuple[int, int]:
        stats = getattr(self.client, "stats", None)
        return getattr(stats, "queries", 0), getattr(stats, "errors", 0)

    def _evaluate(self, now: float, budget: float) -> Evaluation | None:
        """Run the evaluator on a worker thread for at most ``budget`` seconds (None: dropped)."""
        if self._worker is not None and self._worker.is_alive():
            raise _Dropped("evaluation (the previous one is still running)")
        box: dict[str, object] = {}

        def work() -> None:
            try:
                box["ok"] = self.evaluator(self.client, self.settings, self.rules, aligned(now, self.settings.evaluation.step))
            except BaseException as exc:  # handed to the cycle thread below
                box["err"] = exc

        self._worker = threading.Thread(target=work, name="kvwatch-evaluation", daemon=True)
        self._worker.start()
        self._worker.join(budget)
        if self._worker.is_alive():
            raise _Dropped(f"evaluation (over its {budget:.3g}s deadline)")
        if "err" in box:
            raise box["err"]  # type: ignore[misc]
        return box["ok"]  # type: ignore[return-value]

    def _cycle(self) -> CycleReport:
        t0 = time.monotonic()
        now = self.clock()
        interval = self.settings.evaluation.interval
        q0, e0 = self._queries()
        report = CycleReport(ok=True, duration_s=0.0)
        try:
            ev = self._evaluate(now, EVAL_SHARE * interval)
            if ev is not None:
                if ev.notes != self._notes:  # a remark on the configuration: once, not every cycle
                    for note in ev.notes:
                        log.warning("kvwatch: %s", note)
                    self._notes = ev.notes
                self._track(ev, now, report)
        except _Dropped as exc:
            report.ok = False
            report.dropped.append(str(exc))
            report.open = sum(i.state.value == "firing" for i in self.store.load().values())
        except KvwatchError as exc:
            report.ok, report.error = False, str(exc)
            report.open = sum(i.state.value == "firing" for i in self.store.load().values())
        except Exception as exc:  # a cycle must survive anything; the summary line says what
            report.ok, report.error = False, f"{type(exc).__name__}: {exc}"
            report.open = sum(i.state.value == "firing" for i in self.store.load().values())
        if not self.dry_run:
            try:
                hold: frozenset[str] = frozenset()
                if self.lease is not None and self.lease.refresh(self.client, now) == "follower":
                    self.lease.settle(self.store, self.settings.evaluation.interval)
                    hold = LEADER_SINKS  # the leader posts these; we keep them until it is gone
                d = drain(self.store, self.notifiers, now, on_result=self.metrics.notified,
                          deadline=time.monotonic() + DELIVERY_SHARE * interval, hold=hold)
                report.sent, report.failed, report.dead = d.sent, d.failed, d.dead
                if d.overdue:
                    report.dropped.append(f"{d.overdue} deliveries (delivery deadline; queued for the next cycle)")
                if d.errors:  # in the one summary line, not a line per failure
                    report.delivery_error = d.errors[-1]
            except Exception as exc:
                report.ok, report.error = False, report.error or f"delivery: {type(exc).__name__}: {exc}"
        leader = self.lease is None or self.lease.role == "leader"  # a follower posts nothing to Slack
        if not self.dry_run and leader and not self._swept and self._clear is not None:
            self._sweep(now, report)
        report.queued = self.store.pending()
        q1, e1 = self._queries()
        report.queries = q1 - q0
        self.metrics.queries.inc(max(0, q1 - q0))
        self.metrics.query_errors.inc(max(0, e1 - e0))
        report.duration_s = time.monotonic() - t0
        self.metrics.cycle_duration.observe(report.duration_s)
        self.metrics.cycles.labels(outcome="ok" if report.ok else "error").inc()
        if report.ok:
            self.last_ok_at = self.clock()
            self.metrics.last_cycle.set(self.last_ok_at)
        self.last_report = report
        if self.lease is not None:
            self.metrics.ha_heartbeat.labels(replica=self.lease.replica).set(self.clock())
        (log.info if report.ok else log.error)("%s", report.line(self.dry_run))
        return report

    def _sweep(self, now: float, report: CycleReport) -> None:
        """Once after start: resolve Slack threads left open for engines that are clear now."""
        slack = self.notifiers.get("slack")
        clear = self._clear or set()
        if slack is None or not clear or not hasattr(slack, "sweep"):
            self._swept = True
            return
        try:
            report.resolved += slack.sweep(clear, now)
            self._swept = True
        except DeliveryError as exc:
            report.delivery_error = str(exc)  # tried again next cycle

    def _track(self, ev: Evaluation, now: float, report: CycleReport) -> None:
        self.metrics.observe_evaluation(ev)
        for r in ev.results:
            report.states[r.state.value] = report.states.get(r.state.value, 0) + 1
        incidents, events = self.lifecycle.step(self.store.load(), ev.results, now)
        report.fired = sum(e.kind is EventKind.FIRE for e in events)
        report.resolved = sum(e.kind is EventKind.RESOLVE for e in events)
        if self.dry_run:
            for e in events:
                log.info("dry-run: %s", event_line(e))
            self.store.commit(incidents, [])
        else:
            self.store.commit(incidents, [(sink, e) for e in events for sink in self.notifiers])
            if self.alertmanager is not None:
                for res in self.alertmanager.sync(incidents.values(), now):
                    self.metrics.notified("alertmanager", "ok" if res.ok else "error")
        known = {(k.job, k.instance) for k in incidents}
        self._clear = {(r.target.key.job, r.target.key.instance) for r in ev.results
                       if not findings_of(r) and (r.target.gone or r.state is not FailureMode.UNKNOWN)} - known
        self.metrics.observe_incidents(incidents)
        report.open = sum(i.state.value == "firing" for i in incidents.values())

    def ready(self, max_age_s: float) -> bool:
        return self.last_ok_at is not None and self.clock() - self.last_ok_at <= max_age_s
