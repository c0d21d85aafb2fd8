"""kvwatch's own metrics, on an injected ``CollectorRegistry`` (no global registry).

The metric names are a contract: the shipped dashboards and alert rules use them.
Counters and the cycle histogram are ordinary client objects. Everything that
describes the last evaluation (targets by state, per-target state, diagnoses,
missing signals, open incidents) is one immutable :class:`Snapshot` replaced
atomically after each evaluation and rendered by :class:`SnapshotCollector` at
scrape time: no gauges are cleared and refilled, so a scrape never sees a
partial set, and an unchanged fleet costs nothing between scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvwatch.alerting.lifecycle import Incident, open_counts
from kvwatch.core.models import Evaluation, FailureMode, Severity

_TARGET = ("job", "instance", "model", "engine", "state")
_INCIDENT_KEYS = tuple(
    (m.value, s.value) for m in FailureMode for s in Severity if m is not FailureMode.HEALTHY and s is not Severity.INFO
)

Row = tuple[tuple[str, ...], float]


@dataclass(frozen=True)
class Snapshot:
    """Label values → value for every per-evaluation family (tuples: shared safely across threads)."""

    targets: tuple[Row, ...] = tuple(((m.value,), 0.0) for m in FailureMode)
    target_state: tuple[Row, ...] = ()
    diagnosis_active: tuple[Row, ...] = ()
    missing_signals: tuple[Row, ...] = ()
    incidents_open: tuple[Row, ...] = tuple((k, 0.0) for k in _INCIDENT_KEYS)

    @classmethod
    def of_evaluation(cls, ev: Evaluation, base: Snapshot) -> Snapshot:
        counts = {m.value: 0 for m in FailureMode}
        state: list[Row] = []
        diag: list[Row] = []
        missing: list[Row] = []
        for r in ev.results:
            t = r.target
            counts[r.state.value] += 1
            for st in FailureMode:
                state.append(((t.key.job, t.key.instance, t.model, t.engine, st.value), 1.0 if st is r.state else 0.0))
            for d in r.diagnoses:
                diag.append(((t.key.job, t.key.instance, d.mode.value, d.severity.value), 1.0))
            gaps = [m for m in r.missing_signals if not m.startswith("rule ")]
            missing.append(((t.key.job, t.key.instance), float(len(gaps))))
        return replace(base, targets=tuple(((k,), float(v)) for k, v in counts.items()),
                       target_state=tuple(state), diagnosis_active=tuple(dict(diag).items()),
                       missing_signals=tuple(dict(missing).items()))


#: (family, help, label names, Snapshot field)
_FAMILIES = (
    ("kvwatch_targets", "Targets by state at the last cycle.", ("state",), "targets"),
    ("kvwatch_target_state", "1 for the current state of each target.", _TARGET, "target_state"),
    ("kvwatch_diagnosis_active", "1 per matched diagnosis at the last cycle.",
     ("job", "instance", "mode", "severity"), "diagnosis_active"),
    ("kvwatch_target_missing_signals", "Canonical signals a target does not export.",
     ("job", "instance"), "missing_signals"),
    ("kvwatch_incidents_open", "Firing incidents by mode and severity.", ("mode", "severity"), "incidents_open"),
)


class SnapshotCollector(Collector):
    """Renders the current :class:`Snapshot`; one attribute read, so a scrape sees one whole evaluation."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot  # a single reference read: later swaps do not affect this scrape
        for name, doc, labels, attr in _FAMILIES:
            fam = GaugeMetricFamily(name, doc, labels=list(labels))
            for values, v in getattr(snap, attr):
                fam.add_metric(list(values), v)
            yield fam

    def describe(self) -> Iterator[Metric]:
        for name, doc, labels, _ in _FAMILIES:
            yield GaugeMetricFamily(name, doc, labels=list(labels))


class SelfMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry(auto_describe=True)
        self.cycle_duration = Histogram(
            "kvwatch_cycle_duration_seconds", "Duration of one evaluation cycle.", registry=r,
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.cycles = Counter("kvwatch_cycles", "Evaluation cycles by outcome.", ["outcome"], registry=r)
        self.queries = Counter("kvwatch_queries", "PromQL queries sent to Prometheus.", registry=r)
        self.query_errors = Counter("kvwatch_query_errors", "PromQL queries that failed.", registry=r)
        self.last_cycle = Gauge(
            "kvwatch_last_cycle_timestamp_seconds", "Unix time of the last successful cycle.", registry=r
        )
        self.notifications = Counter(
            "kvwatch_notifications", "Delivery attempts by sink and outcome.", ["sink", "outcome"], registry=r
        )
        self.config_reload_errors = Counter(
            "kvwatch_config_reload_errors", "Config reloads (SIGHUP) rejected as invalid.", registry=r
        )
        self.state_errors = Counter("kvwatch_state_errors", "State file errors (kept running in memory).", registry=r)
        self.ha_heartbeat = Gauge(
            "kvwatch_ha_heartbeat_timestamp_seconds", "End of this replica's last cycle (HA lease).",
            ["replica"], registry=r,
        )
        self.snapshot = SnapshotCollector()
        r.register(self.snapshot)
        for outcome in ("ok", "error"):
            self.cycles.labels(outcome=outcome)

    def observe_evaluation(self, ev: Evaluation) -> None:
        """Replace the per-target series with this evaluation's (targets that vanished disappear)."""
        self.snapshot.snapshot = Snapshot.of_evaluation(ev, self.snapshot.snapshot)

    def observe_incidents(self, incidents: Mapping[object, Incident]) -> None:
        counts = open_counts(incidents)  # type: ignore[arg-type]
        rows = tuple((k, float(counts.get(k, 0))) for k in _INCIDENT_KEYS)
        self.snapshot.snapshot = replace(self.snapshot.snapshot, incidents_open=rows)

    def notified(self, sink: str, outcome: str) -> None:
        self.notifications.labels(sink=sink, outcome=outcome).inc()
