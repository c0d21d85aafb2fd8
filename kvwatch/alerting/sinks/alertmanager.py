"""Alertmanager sink: POST ``/api/v2/alerts`` to every configured Alertmanager.

Follows Prometheus' rule manager. Alerts stay per mode (``KVCacheFull`` …): every
finding of a firing incident is one alert, grouped by target in Alertmanager
(``group_by: [job, instance]``). Every cycle posts all active alerts with
``endsAt`` a few intervals ahead (they expire by themselves if kvwatch dies); an
alert that stops being active is sent as resolved (``endsAt`` = when it ended)
and **re-sent for 15 minutes** (``RESOLVED_RETENTION_S``), so one failed POST
does not lose the resolve. A *blind* incident (target present, signals missing)
stays firing (blindness never resolves a page) but is refreshed for at most
``lifecycle.forget_after`` after it went blind; then Alertmanager expires it.

kvwatch silences (``lifecycle.silences``) do not stop posting (that would let
Alertmanager expire the alert and send a false "resolved"): they are created in
Alertmanager through its API instead (``createdBy: kvwatch``), so Alertmanager
silences the alert. Two kvwatch replicas post identical label sets and
Alertmanager deduplicates them. Pending incidents are not posted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import requests

from kvwatch.alerting.lifecycle import Finding, Incident, IncidentState
from kvwatch.alerting.sinks.links import grafana_url, prometheus_url
from kvwatch.config import Settings, Silence
from kvwatch.core.models import FailureMode
from kvwatch.durations import parse_time
from kvwatch.redact import basic_auth, scrub, split_userinfo
from kvwatch.textsafe import printable

log = logging.getLogger("kvwatch.alerting.sinks.alertmanager")

#: firing alerts carry endsAt = now + this many evaluation intervals (min 5 minutes)
EXPIRY_INTERVALS = 4


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


#: resolved alerts are re-sent this long (Prometheus' resolvedRetention)
RESOLVED_RETENTION_S = 900.0


#: how long a blind alert is refreshed when `lifecycle.forget_after` is 0 (never forget), seconds
BLIND_REFRESH_DEFAULT_S = 86400.0


def _iso_ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def alertname(mode: FailureMode) -> str:
    return "KVCache" + mode.value.capitalize()


def to_alerts(settings: Settings, inc: Incident, now: float) -> list[dict[str, Any]]:
    """One Alertmanager v2 ``postableAlert`` per finding of ``inc`` (the primary first)."""
    labels = inc.label_map
    expiry = max(300.0, EXPIRY_INTERVALS * settings.evaluation.interval)
    if inc.state is IncidentState.RESOLVED:
        ends = inc.resolved_at or now
    elif inc.blind_since is not None:
        # blindness never resolves a page (letting the alert expire would send a false
        # "resolved"), but a blind alert is not refreshed forever either: at most
        # `forget_after` (24 h when that is disabled) after it went blind, then it expires
        hold = settings.lifecycle.forget_after or BLIND_REFRESH_DEFAULT_S
        ends = min(now, inc.blind_since + hold) + expiry
    else:
        ends = now + expiry
    dash = grafana_url(settings, inc, now)
    out = []
    for f in inc.findings or (Finding(inc.mode, inc.severity, inc.rule_id, inc.summary),):
        out_labels = {"alertname": alertname(f.mode), "mode": f.mode.value, "severity": f.severity.value}
        # label values come from engines: control characters escaped (deterministically, so
        # replicas still post identical label sets and Alertmanager deduplicates them)
        for k in ("job", "instance", "model", "engine"):
            if labels.get(k):
                out_labels[k] = printable(labels[k])
        primary = f.mode is inc.mode
        annotations = {
            "summary": printable(inc.summary if primary else f.summary),
            "triage": "\n".join(f"{i}. {printable(s)}" for i, s in enumerate(inc.triage, start=1)) if primary else "",
            "rule": printable(f.rule_id),
            "confidence": f"{inc.confidence:.2f}",
        }
        if inc.blind_since is not None:
            annotations["blind"] = (f"since {_iso(inc.blind_since)} ({printable(inc.blind_reason)}); "
                                    "held open until the signals return")
        if dash:
            annotations["dashboard_url"] = dash
        out.append({
            "labels": out_labels,
            "annotations": {k: v for k, v in annotations.items() if v},
            "startsAt": _iso(inc.fired_at or inc.started_at),
            "endsAt": _iso(ends),
            "generatorURL": prometheus_url(settings, inc, now),
        })
    return out


def to_alert(settings: Settings, inc: Incident, now: float) -> dict[str, Any]:
    """The primary mode's alert of ``inc``."""
    return to_alerts(settings, inc, now)[0]


@dataclass(frozen=True)
class PostResult:
    url: str
    alerts: int
    ok: bool
    error: str = ""


@dataclass
class _Sent:
    alert: dict[str, Any]
    resolved_at: float | None = None


def _key(alert: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(alert["labels"].items()))


class AlertmanagerSink:
    name = "alertmanager"

    def __init__(self, settings: Settings, session: requests.Session | None = None) -> None:
        self.settings = settings
        self.session = session or requests.Session()
        #: every alert posted, by label set, until its resolve has been re-sent for RESOLVED_RETENTION_S
        self.sent: dict[tuple[tuple[str, str], ...], _Sent] = {}
        self._silences_checked_at = -math.inf

    def alerts(self, incidents: Iterable[Incident], now: float) -> list[dict[str, Any]]:
        """Active alerts plus resolved ones still inside their re-send retention."""
        active: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        for inc in incidents:
            if inc.state is IncidentState.PENDING:
                continue
            if inc.state is IncidentState.RESOLVED and not inc.event_emitted and not inc.silenced:
                continue
            for a in to_alerts(self.settings, inc, now):
                if inc.state is IncidentState.RESOLVED:
                    self.sent[_key(a)] = _Sent(a, inc.resolved_at or now)
                elif _iso_ts(a["endsAt"]) > now:
                    active[_key(a)] = a
        for k, a in active.items():
            self.sent[k] = _Sent(a)
        for k, sent in list(self.sent.items()):
            if k in active:
                continue
            if sent.resolved_at is None:  # stopped being active (mode change, blind alert expired): ended now
                ends = min(now, _iso_ts(sent.alert["endsAt"]))
                sent.resolved_at = ends
                sent.alert = {**sent.alert, "endsAt": _iso(ends)}
            if now - sent.resolved_at > RESOLVED_RETENTION_S:
                del self.sent[k]
        return [s.alert for s in self.sent.values()]

    def sync(self, incidents: Iterable[Incident], now: float) -> list[PostResult]:
        """Post the current alerts to every URL; never raises (one result per URL)."""
        self.sync_silences(now)
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

    def sync_silences(self, now: float) -> None:
        """Create each configured kvwatch silence in every Alertmanager (once; re-checked every 10 min)."""
        wanted = [s for s in self.settings.lifecycle.silences if s.matchers]
        if not wanted or now - self._silences_checked_at < 600:
            return
        self._silences_checked_at = now
        for configured in self.settings.alertmanager.urls:
            base, cred = split_userinfo(configured)
            headers = {"Authorization": basic_auth(*cred)} if cred else None
            try:
                resp = self.session.get(base.rstrip("/") + "/api/v2/silences", timeout=self.settings.alertmanager.timeout,
                                        headers=headers)
                resp.raise_for_status()
                have = {x.get("comment") for x in resp.json()
                        if x.get("createdBy") == "kvwatch" and (x.get("status") or {}).get("state") != "expired"}
                for sil in wanted:
                    body = silence_body(sil, now)
                    if body is None or body["comment"] in have:
                        continue
                    r = self.session.post(base.rstrip("/") + "/api/v2/silences", json=body,
                                          timeout=self.settings.alertmanager.timeout, headers=headers)
                    r.raise_for_status()
            except (requests.RequestException, ValueError) as exc:
                self._silences_checked_at = -math.inf  # try again next cycle
                log.warning("kvwatch: Alertmanager at %s: silences not synced: %s", base, scrub(str(exc)))


def silence_body(sil: Silence, now: float) -> dict[str, Any] | None:
    """The Alertmanager silence for one kvwatch silence; None when it has already ended."""
    ends = parse_time(sil.until).timestamp() if sil.until else now + 365 * 86400.0
    if ends <= now:
        return None
    ident = hashlib.sha256(json.dumps([sorted(sil.matchers.items()), sil.until]).encode()).hexdigest()[:12]
    return {
        "matchers": [{"name": k, "value": v, "isRegex": False, "isEqual": True} for k, v in sorted(sil.matchers.items())],
        "startsAt": _iso(now),
        "endsAt": _iso(ends),
        "createdBy": "kvwatch",
        "comment": f"kvwatch silence {ident}: {sil.comment}".strip().rstrip(":"),
    }
