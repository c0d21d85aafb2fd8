"""Drill-down links for a notification: the Grafana instance dashboard and a Prometheus graph."""

from __future__ import annotations

from urllib.parse import urlencode

from kvwatch.alerting.lifecycle import Incident
from kvwatch.config import Settings
from kvwatch.core.dialects import DIALECT_BY_ID
from kvwatch.core.selector import target_matchers
from kvwatch.core.signals import Signal
from kvwatch.durations import format_duration
from kvwatch.redact import clean_url

#: context shown around an incident, seconds before its start and after now
MARGIN_S = 1800.0


def kv_usage_query(incident: Incident, rate_window: str = "2m") -> str:
    """PromQL of the KV usage of this target in its own dialect (fallback: vLLM's current name)."""
    labels = incident.label_map
    user = target_matchers(labels.get("job", ""), labels.get("instance", ""))
    dialect = DIALECT_BY_ID.get(labels.get("dialect", ""))
    sources = dialect.sources.get(Signal.KV_USAGE, ()) if dialect else ()
    if sources:
        # every source of the dialect: the target's engine version picks which one has data
        return " or ".join(src.promql(user, rate_window) for src in sources)
    return f"max by (job, instance) (vllm:kv_cache_usage_perc{{{user}}})"


def grafana_url(settings: Settings, incident: Incident, now: float) -> str:
    """``{grafana}/d/{uid}?var-instance=…&from=…&to=…`` (ms), or "" when no Grafana is configured."""
    base = clean_url(settings.links.grafana_url).rstrip("/")
    if not base:
        return ""
    labels = incident.label_map
    start = incident.started_at - MARGIN_S
    end = (incident.resolved_at or now) + MARGIN_S / 6
    query = urlencode(
        {
            "var-job": labels.get("job", ""),
            "var-instance": labels.get("instance", ""),
            "from": int(start * 1000),
            "to": int(end * 1000),
        }
    )
    return f"{base}/d/{settings.links.dashboard_uid}?{query}"


def prometheus_url(settings: Settings, incident: Incident, now: float) -> str:
    """The Prometheus graph page of the KV usage query over the incident."""
    # people open this link: never with the service's credentials in it
    base = clean_url(settings.prometheus.external_url or settings.prometheus.url).rstrip("/")
    end = incident.resolved_at or now
    span = max(end - incident.started_at + MARGIN_S, 3600.0)
    query = urlencode(
        {
            "g0.expr": kv_usage_query(incident, format_duration(settings.evaluation.rate_window)),
            "g0.tab": "0",
            "g0.range_input": format_duration(span),
            "g0.end_input": _iso(end + MARGIN_S / 6),
        }
    )
    return f"{base}/graph?{query}"


def _iso(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
