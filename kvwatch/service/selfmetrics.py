"""kvwatch's own metrics, on an injected ``CollectorRegistry`` (no global registry).

The metric names are a contract: the shipped dashboards and alert rules use them.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvwatch.alerting.lifecycle import Incident, open_counts
from kvwatch.core.models import Evaluation, FailureMode, Severity

_TARGET = ("job", "instance", "model", "engine", "state")


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
        self.targets = Gauge("kvwatch_targets", "Targets by state at the last cycle.", ["state"], registry=r)
        self.target_state = Gauge(
            "kvwatch_target_state", "1 for the current state of each target.", list(_TARGET), registry=r
        )
        self.diagnosis_active = Gauge(
            "kvwatch_diagnosis_active", "1 per matched diagnosis at the last cycle.",
            ["job", "instance", "mode", "severity"], registry=r,
        )
        self.missing_signals = Gauge(
            "kvwatch_target_missing_signals", "Canonical signals a target does not export.",
            ["job", "instance"], registry=r,
        )
        self.notifications = Counter(
            "kvwatch_notifications", "Delivery attempts by sink and outcome.", ["sink", "outcome"], registry=r
        )
        self.incidents_open = Gauge(
            "kvwatch_incidents_open", "Firing incidents by mode and severity.", ["mode", "severity"], registry=r
        )
        self.config_reload_errors = Counter(
            "kvwatch_config_reload_errors", "Config reloads (SIGHUP) rejected as invalid.", registry=r
        )
        self.state_errors = Counter("kvwatch_state_errors", "State file errors (kept running in memory).", registry=r)
        for outcome in ("ok", "error"):
            self.cycles.labels(outcome=outcome)
        for state in FailureMode:
            self.targets.labels(state=state.value).set(0)
        for mode in FailureMode:
            for sev in Severity:
                if mode is not FailureMode.HEALTHY and sev is not Severity.INFO:
                    self.incidents_open.labels(mode=mode.value, severity=sev.value).set(0)

    def observe_evaluation(self, ev: Evaluation) -> None:
        """Replace the per-target series with this evaluation's (targets that vanished disappear)."""
        self.target_state.clear()
        self.diagnosis_active.clear()
        self.missing_signals.clear()
        counts = {m.value: 0 for m in FailureMode}
        for r in ev.results:
            t = r.target
            counts[r.state.value] += 1
            for state in FailureMode:
                self.target_state.labels(t.key.job, t.key.instance, t.model, t.engine, state.value).set(
                    1 if state is r.state else 0
                )
            for d in r.diagnoses:
                self.diagnosis_active.labels(t.key.job, t.key.instance, d.mode.value, d.severity.value).set(1)
            gaps = [m for m in r.missing_signals if not m.startswith("rule ")]
            self.missing_signals.labels(t.key.job, t.key.instance).set(len(gaps))
        for state, n in counts.items():
            self.targets.labels(state=state).set(n)

    def observe_incidents(self, incidents: Mapping[object, Incident]) -> None:
        counts = open_counts(incidents)  # type: ignore[arg-type]
        for mode in FailureMode:
            for sev in Severity:
                if mode is not FailureMode.HEALTHY and sev is not Severity.INFO:
                    self.incidents_open.labels(mode=mode.value, severity=sev.value).set(
                        counts.get((mode.value, sev.value), 0)
                    )

    def notified(self, sink: str, outcome: str) -> None:
        self.notifications.labels(sink=sink, outcome=outcome).inc()
