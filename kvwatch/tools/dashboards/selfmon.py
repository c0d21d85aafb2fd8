"""The kvwatch self-monitoring dashboard (uid ``kvwatch-self``).

Reads only kvwatch's own metrics (names agreed with the service, see
:data:`SELF_METRICS`). Scrape kvwatch with ``honor_labels: true`` so its
per-target series keep the engines' ``job``/``instance`` labels.
"""

from __future__ import annotations

from kvwatch.tools.dashboards import common as c
from kvwatch.tools.dashboards.grafana import Dashboard, Panel, PanelType, Target, Variable, row

#: Self-metric families the dashboards read (contract with kvwatch.service).
SELF_METRICS: tuple[str, ...] = (
    "kvwatch_cycle_duration_seconds",
    "kvwatch_cycles_total",
    "kvwatch_queries_total",
    "kvwatch_query_errors_total",
    "kvwatch_last_cycle_timestamp_seconds",
    "kvwatch_targets",
    "kvwatch_target_state",
    "kvwatch_diagnosis_active",
    "kvwatch_target_missing_signals",
    "kvwatch_notifications_total",
    "kvwatch_incidents_open",
)
_K = '{job=~"$job", instance=~"$instance"}'
_W = "[$__rate_interval]"
TS = PanelType.TIMESERIES


def _cycle_panels() -> tuple[Panel, ...]:
    hist = "kvwatch_cycle_duration_seconds"
    q = [
        Target(f"histogram_quantile({p}, sum by (le) (rate({hist}_bucket{_K}{_W})))", f"p{p * 100:g}")
        for p in (0.5, 0.99)
    ]
    q.append(Target(f"sum(rate({hist}_sum{_K}{_W})) / sum(rate({hist}_count{_K}{_W}))", "mean"))
    return (
        Panel(
            "Cycle duration",
            TS,
            "Wall time of one evaluation cycle (discover, collect, diagnose, notify), windowed. It must stay "
            "well below the evaluation interval; growth follows the number of targets and Prometheus latency.",
            tuple(q),
            unit="s",
            min=0,
        ),
        Panel(
            "Cycles by outcome",
            TS,
            "Cycles per second by outcome. Any non-ok outcome means a cycle failed (Prometheus unreachable, "
            "bad rules); kvwatch keeps running and retries on the next interval.",
            (Target(f"sum by (outcome) (rate(kvwatch_cycles_total{_K}{_W}))", "{{outcome}}"),),
            min=0,
        ),
        Panel(
            "Time since last completed cycle",
            PanelType.STAT,
            "Seconds since kvwatch last finished a cycle. More than a few intervals means kvwatch is stuck or "
            "down - its silence is not 'all healthy'.",
            (Target(f"time() - max(kvwatch_last_cycle_timestamp_seconds{_K})", "age", instant=True),),
            unit="s",
            width=6,
            thresholds=((300, "red"),),
        ),
        Panel(
            "Prometheus queries and error ratio",
            TS,
            "Queries kvwatch sends per second and the share that failed. Errors make targets 'unknown' for "
            "that cycle; a steady ratio above 0 points at timeouts or a too-large fleet per query.",
            (
                Target(f"sum(rate(kvwatch_queries_total{_K}{_W}))", "queries/s"),
                Target(
                    f"sum(rate(kvwatch_query_errors_total{_K}{_W})) / sum(rate(kvwatch_queries_total{_K}{_W}))",
                    "error ratio",
                ),
            ),
            min=0,
            width=18,
        ),
    )


def _verdict_panels() -> tuple[Panel, ...]:
    return (
        Panel(
            "Targets by state",
            TS,
            "Engine instances per kvwatch state over time (stacked). A growing 'unknown' band is a growing "
            "blind spot (scrape failures, renamed metrics, engines without metrics enabled).",
            (Target(f"sum by (state) (kvwatch_targets{_K})", "{{state}}"),),
            stack=True,
            min=0,
        ),
        Panel(
            "Open incidents by mode and severity",
            TS,
            "Incidents kvwatch is tracking (opened, not yet resolved). One incident per target and mode; "
            "re-notifications do not open new ones.",
            (Target(f"sum by (mode, severity) (kvwatch_incidents_open{_K})", "{{mode}} {{severity}}"),),
            min=0,
        ),
        Panel(
            "Notifications by sink and outcome",
            TS,
            "Notifications sent per window to Slack / Alertmanager, by outcome. Failed sends are retried "
            "on the next cycle; a persistent 'error' means the token, webhook or Alertmanager URL is wrong.",
            (Target(f"sum by (sink, outcome) (increase(kvwatch_notifications_total{_K}{_W}))", "{{sink}} {{outcome}}"),),
            min=0,
        ),
        Panel(
            "Blind spots: targets with missing signals",
            PanelType.TABLE,
            "Targets that do not export some canonical signals (value = how many). Rules needing them are "
            "skipped, so those failure modes cannot be ruled out for the target; enable the engine's metrics or "
            "upgrade it.",
            (
                Target(
                    "max by (job, instance) (kvwatch_target_missing_signals) > 0",
                    instant=True,
                    fmt="table",
                ),
            ),
        ),
    )


def build() -> Dashboard:
    panels = (
        row("Evaluation loop"),
        *_cycle_panels(),
        row("Verdicts, incidents and notifications"),
        *_verdict_panels(),
    )
    variables = (
        Variable("datasource", "Data source", kind="datasource"),
        Variable("job", "kvwatch job", "label_values(kvwatch_cycles_total, job)", all_value=".*"),
        Variable("instance", "kvwatch instance", 'label_values(kvwatch_cycles_total{job=~"$job"}, instance)'),
    )
    return Dashboard(
        uid=c.SELF_UID,
        title="kvwatch / self",
        description="Is kvwatch itself evaluating, querying and notifying? Cycle duration, query errors, "
        "notifications and blind spots.",
        panels=panels,
        variables=variables,
        links=c.dashboard_links(c.SELF_UID),
        time_from="now-6h",
    )
