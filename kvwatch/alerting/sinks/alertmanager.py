"""Alertmanager sink: POST ``/api/v2/alerts`` to every configured Alertmanager.

Alertmanager wants active alerts re-sent regularly, so this sink is not an
outbox: every cycle it posts all firing incidents (``endsAt`` a few intervals
ahead, so alerts expire by themselves if kvwatch dies) and, once, the ones that
resolved this cycle (``endsAt`` = resolution time). Two kvwatch replicas post
identical label sets and Alertmanager deduplicates them. Config silences and
pending incidents are not posted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import requests

from kvwatch.alerting.lifecycle import Incident, IncidentState
from kvwatch.alerting.sinks.links import grafana_url, prometheus_url
from kvwatch.config import Settings
from kvwatch.redact import basic_auth, scrub, split_userinfo
from kvwatch.textsafe import printable

log = logging.getLogger("kvwatch.alerting.sinks.alertmanager")

#: firing alerts carry endsAt = now + this many evaluation intervals (min 5 minutes)
EXPIRY_INTERVALS = 4


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def alertname(inc: Incident) -> str:
    return "KVCache" + inc.key.mode.value.capitalize()


def to_alert(settings: Settings, inc: Incident, now: float) -> dict[str, Any]:
    """One Alertmanager v2 ``postableAlert``."""
    labels = inc.label_map
    out_labels = {"alertname": alertname(inc), "mode": inc.key.mode.value, "severity": inc.severity.value}
    # label values come from engines: control characters escaped (deterministically, so
    # replicas still post identical label sets and Alertmanager deduplicates them)
    for k in ("job", "instance", "model", "engine"):
        if labels.get(k):
            out_labels[k] = printable(labels[k])
    annotations = {
        "summary": printable(inc.summary),
        "triage": "\n".join(f"{i}. {printable(s)}" for i, s in enumerate(inc.triage, start=1)),
        "rule": printable(inc.rule_id),
        "confidence": f"{inc.confidence:.2f}",
    }
    if inc.blind_since is not None:
        annotations["blind"] = f"since {_iso(inc.blind_since)} ({inc.blind_reason}); held open until the signals return"
    dash = grafana_url(settings, inc, now)
    if dash:
        annotations["dashboard_url"] = dash
    if inc.state is IncidentState.RESOLVED:
        ends = inc.resolved_at or now
    else:
        ends = now + max(300.0, EXPIRY_INTERVALS * settings.evaluation.interval)
    return {
        "labels": out_labels,
        "annotations": annotations,
        "startsAt": _iso(inc.fired_at or inc.started_at),
        "endsAt": _iso(ends),
        "generatorURL": prometheus_url(settings, inc, now),
    }


@dataclass(frozen=True)
class PostResult:
    url: str
    alerts: int
    ok: bool
    error: str = ""


class AlertmanagerSink:
    name = "alertmanager"

    def __init__(self, settings: Settings, session: requests.Session | None = None) -> None:
        self.settings = settings
        self.session = session or requests.Session()

    def alerts(self, incidents: Iterable[Incident], now: float) -> list[dict[str, Any]]:
        out = []
        for inc in incidents:
            if inc.silenced or inc.state is IncidentState.PENDING:
                continue
            if inc.state is IncidentState.RESOLVED and not inc.event_emitted:
                continue
            out.append(to_alert(self.settings, inc, now))
        return out

    def sync(self, incidents: Iterable[Incident], now: float) -> list[PostResult]:
        """Post the current alerts to every URL; never raises (one result per URL)."""
        alerts = self.alerts(incidents, now)
        results = []
        if not alerts:
            return results
        for configured in self.settings.alertmanager.urls:
            base, cred = split_userinfo(configured)  # shown in logs and results: without credentials
            url = base.rstrip("/") + "/api/v2/alerts"
            headers = {"Authorization": basic_auth(*cred)} if cred else None
            try:
                resp = self.session.post(url, json=alerts, timeout=self.settings.alertmanager.timeout, headers=headers)
                if resp.status_code >= 300:
                    raise requests.HTTPError(f"HTTP {resp.status_code}: {resp.text[:200]}")
                results.append(PostResult(base, len(alerts), True))
            except requests.RequestException as exc:
                error = scrub(str(exc))
                log.warning("kvwatch: Alertmanager at %s: %s", base, error)
                results.append(PostResult(base, len(alerts), False, error))
        return results
