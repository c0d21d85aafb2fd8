"""Alert lifecycle: one small, pure state machine per engine (target). No clock, no I/O.

One incident per engine *episode*: its primary mode is the most severe
incident-grade finding (ties by mode precedence); other findings of the same
target are co-findings of the same incident, not incidents of their own.
``pending`` → ``firing`` once the primary finding has been present for
``lifecycle.pending_for`` (a blind spot: ``blind_spot_for``); the rule's own
``for`` is checked inside each evaluation, over data that must cover it.
``firing`` → ``resolved`` once clear for ``hold_down``. Events: ``fire``,
``update`` (mode change, escalation, a new co-finding: one reply in the
thread), ``remind``, ``resolve``.

Three ways a target can stop matching, kept apart on purpose:

* *cleared*: the target is evaluated and nothing matches → resolve after ``hold_down``;
* *gone*: the target disappeared from scraping (``Target.gone``, or absent from the
  results altogether) → resolve quietly as ``gone`` after ``hold_down``;
* *blind*: present but the incident's mode cannot be decided (its signals vanished:
  the per-mode verdict is undecidable, or nothing could be evaluated) → the incident
  stays open, frozen and marked blind (``blind_since``, ``blind_reason``; one
  ``blind`` event once it has lasted ``blind_notice_after``); nothing resolves, re-fires or reminds until the signals return,
  and clearing is measured from their return. When nothing at all could be evaluated
  (KV usage missing) it resolves as ``expired`` after ``forget_after`` without data. A mode *decided* not matched clears, whatever the
  target's overall state.

Silences (label matchers) suppress Slack/console events; the incident is still
tracked, and an incident already announced still gets its resolve.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from kvwatch.config import LifecycleSettings, Silence
from kvwatch.core.models import (
    Diagnosis,
    Evidence,
    FailureMode,
    Severity,
    TargetKey,
    TargetResult,
    Verdict,
)
from kvwatch.durations import parse_time

#: float comparisons of durations tolerate scheduler jitter of this many seconds
_EPS = 1e-6


class IncidentState(StrEnum):
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"


class EventKind(StrEnum):
    FIRE = "fire"
    UPDATE = "update"
    REMIND = "remind"
    RESOLVE = "resolve"
    #: the firing incident's signals vanished: it stays open, marked blind
    BLIND = "blind"


@dataclass(frozen=True, order=True)
class IncidentKey:
    """One incident per engine: the Prometheus ``job`` and ``instance`` labels, stored as fields
    (``job="namespace/name"`` from the Prometheus Operator must survive a restart)."""

    job: str
    instance: str

    @property
    def target(self) -> TargetKey:
        return TargetKey(self.job, self.instance)

    def __str__(self) -> str:  # display only; never parsed back
        return f"{self.job}/{self.instance}" if self.job else self.instance

    def to_json(self) -> dict[str, str]:
        return {"job": self.job, "instance": self.instance}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> IncidentKey:
        return cls(str(d["job"]), str(d["instance"]))


@dataclass(frozen=True)
class Finding:
    """One incident-grade diagnosis of the target (the primary or a co-finding)."""

    mode: FailureMode
    severity: Severity
    rule_id: str
    summary: str = ""

    def to_json(self) -> dict[str, str]:
        return {"mode": self.mode.value, "severity": self.severity.value, "rule_id": self.rule_id,
                "summary": self.summary}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Finding:
        return cls(FailureMode(d["mode"]), Severity(d["severity"]), d["rule_id"], d.get("summary", ""))


@dataclass(frozen=True)
class Incident:
    """One engine episode. Times are Unix seconds; ``None`` means "not yet"."""

    key: IncidentKey
    mode: FailureMode
    state: IncidentState
    labels: tuple[tuple[str, str], ...]
    rule_id: str
    severity: Severity
    started_at: float
    last_seen_at: float
    summary: str = ""
    cause: str = ""
    confidence: float = 0.0
    evidence: tuple[Evidence, ...] = ()
    triage: tuple[str, ...] = ()
    #: every incident-grade finding now, primary first
    findings: tuple[Finding, ...] = ()
    fired_at: float | None = None
    cleared_at: float | None = None
    resolved_at: float | None = None
    #: since when the incident's mode cannot be decided (present, signals missing); None while it can
    blind_since: float | None = None
    #: the signals whose absence leaves the mode undecidable
    blind_reason: str = ""
    #: this blindness was dealt with (its ``blind`` event emitted, or silenced / never announced)
    blind_announced: bool = False
    last_event_at: float | None = None
    event_severity: Severity | None = None
    event_mode: FailureMode | None = None
    #: modes already announced in this episode (primary and co-findings)
    event_modes: tuple[FailureMode, ...] = ()
    silenced: bool = False
    #: why it resolved: "cleared", "gone" (target left scraping) or "expired" (blind for forget_after)
    resolution: str = ""

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    @property
    def event_emitted(self) -> bool:
        return self.last_event_at is not None

    @property
    def uid(self) -> str:
        """This episode (a recurrence after resolution has a new ``started_at``, so a new uid)."""
        return json.dumps([self.key.job, self.key.instance, round(self.started_at, 3)])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": self.key.to_json(),
            "mode": self.mode.value,
            "state": self.state.value,
            "labels": dict(self.labels),
            "rule_id": self.rule_id,
            "severity": self.severity.value,
            "summary": self.summary,
            "cause": self.cause,
            "confidence": self.confidence,
            "evidence": [e.to_json() for e in self.evidence],
            "triage": list(self.triage),
            "findings": [f.to_json() for f in self.findings],
            "blind_reason": self.blind_reason,
            "blind_announced": self.blind_announced,
            "silenced": self.silenced,
            "resolution": self.resolution,
            "event_severity": self.event_severity.value if self.event_severity else None,
            "event_mode": self.event_mode.value if self.event_mode else None,
            "event_modes": [m.value for m in self.event_modes],
        }
        for name in ("started_at", "last_seen_at", "fired_at", "cleared_at", "resolved_at", "blind_since",
                     "last_event_at"):
            out[name] = getattr(self, name)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Incident:
        """Raises KeyError / ValueError / TypeError on a record this version cannot read."""
        return cls(
            key=IncidentKey.from_json(d["key"]),
            mode=FailureMode(d["mode"]),
            state=IncidentState(d["state"]),
            labels=tuple(sorted((str(k), str(v)) for k, v in d["labels"].items())),
            rule_id=d["rule_id"],
            severity=Severity(d["severity"]),
            started_at=d["started_at"],
            last_seen_at=d["last_seen_at"],
            summary=d.get("summary", ""),
            cause=d.get("cause", ""),
            confidence=d.get("confidence", 0.0),
            evidence=tuple(Evidence(**e) for e in d.get("evidence", [])),
            triage=tuple(d.get("triage", [])),
            findings=tuple(Finding.from_json(f) for f in d.get("findings", [])),
            fired_at=d.get("fired_at"),
            cleared_at=d.get("cleared_at"),
            resolved_at=d.get("resolved_at"),
            blind_since=d.get("blind_since"),
            blind_reason=d.get("blind_reason", ""),
            # records written before the notice delay announced a blindness at once
            blind_announced=d.get("blind_announced", d.get("blind_since") is not None),
            # records written before the rename hold last_notified_at / notified_severity
            last_event_at=d.get("last_event_at", d.get("last_notified_at")),
            event_severity=Severity(sev) if (sev := d.get("event_severity", d.get("notified_severity"))) else None,
            event_mode=FailureMode(d["event_mode"]) if d.get("event_mode") else None,
            event_modes=tuple(FailureMode(m) for m in d.get("event_modes", [])),
            silenced=d.get("silenced", False),
            resolution=d.get("resolution", ""),
        )


@dataclass(frozen=True)
class Event:
    """Something to tell people about ``incident`` (its state after the step) at ``at``.

    ``changes`` (updates only) says what changed, in words, for the thread reply."""

    kind: EventKind
    incident: Incident
    at: float
    previous_severity: Severity | None = None
    previous_mode: FailureMode | None = None
    changes: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        """Stable identity: the same event is never queued twice."""
        return f"{self.incident.uid}:{self.kind.value}@{self.at:.3f}"

    def to_json(self) -> dict[str, Any]:
        prev = self.previous_severity.value if self.previous_severity else None
        pmode = self.previous_mode.value if self.previous_mode else None
        return {"kind": self.kind.value, "at": self.at, "previous_severity": prev, "previous_mode": pmode,
                "changes": list(self.changes), "incident": self.incident.to_json()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Event:
        prev = Severity(d["previous_severity"]) if d.get("previous_severity") else None
        pmode = FailureMode(d["previous_mode"]) if d.get("previous_mode") else None
        return cls(EventKind(d["kind"]), Incident.from_json(d["incident"]), d["at"], prev, pmode,
                   tuple(d.get("changes", [])))


def is_incident(d: Diagnosis) -> bool:
    """Only warnings and worse of a non-healthy mode are incidents."""
    return d.mode is not FailureMode.HEALTHY and d.severity.rank >= Severity.WARNING.rank


def findings_of(r: TargetResult) -> list[Diagnosis]:
    """Incident-grade diagnoses, most severe first (ties: mode precedence); none for a gone target."""
    if r.target.gone:
        return []
    found = [d for d in r.diagnoses if is_incident(d)]
    return sorted(found, key=lambda d: (-d.severity.rank, d.mode.rank))


def _labels(r: TargetResult, d: Diagnosis) -> tuple[tuple[str, str], ...]:
    out = dict(r.target.labels)
    out["engine"] = r.target.engine
    out["dialect"] = r.target.dialect
    out["mode"] = d.mode.value
    out["severity"] = d.severity.value
    out["rule"] = d.rule_id
    return tuple(sorted(out.items()))


@dataclass
class Lifecycle:
    """Advance incidents by one evaluation. Deterministic: same inputs, same outputs."""

    config: LifecycleSettings = field(default_factory=LifecycleSettings)

    def silenced(self, inc: Incident, now: float) -> bool:
        labels = inc.label_map
        return any(_silence_matches(s, labels, now) for s in self.config.silences)

    def _required(self, mode: FailureMode) -> float:
        # A rule's own `for` is enforced inside the evaluation (its conditions are computed over
        # the last `for` of data that must cover it); counting it again across cycles would
        # double the detection delay. Only `pending_for` and a blind spot's duration count here.
        base = self.config.blind_spot_for if mode is FailureMode.UNKNOWN else 0.0
        return base + self.config.pending_for

    def step(
        self,
        incidents: Mapping[IncidentKey, Incident],
        results: Sequence[TargetResult],
        now: float,
        *,
        assume_held: bool = False,
    ) -> tuple[dict[IncidentKey, Incident], list[Event]]:
        """Return the incidents after ``now`` and the events to deliver, in key order.

        ``assume_held``: a new condition is taken to have held for its whole
        required duration already (``once --notify``). Incidents resolved in a
        previous step are dropped; a recurrence after resolution is a new episode.
        """
        seen = {IncidentKey(r.target.key.job, r.target.key.instance): r for r in results}
        found = {k: f for k, r in seen.items() if (f := findings_of(r))}
        out: dict[IncidentKey, Incident] = {}
        events: list[Event] = []
        for key in sorted(set(incidents) | set(found)):
            old = incidents.get(key)
            if old is not None and old.state is IncidentState.RESOLVED:
                old = None
            r = seen.get(key)
            fs = found.get(key, [])
            real = [d for d in fs if d.mode is not FailureMode.UNKNOWN]
            inc: Incident | None
            if r is not None and real:
                inc = self._seen(old, key, r, real, now, assume_held)
            elif r is not None and fs and (old is None or old.mode is FailureMode.UNKNOWN):
                inc = self._seen(old, key, r, fs, now, assume_held)  # the blind spot is the incident
            elif old is None:
                continue
            elif r is None or r.target.gone:
                inc = self._cleared(old, now, "gone")
            elif (why := _undecided(r, old.mode)) is not None:
                inc, ev = self._blind(old, now, why, r.mode_verdict(old.mode) is None)
                if inc is not None:
                    out[key] = inc
                    events.extend(ev)
                continue
            else:
                inc = self._cleared(old, now, "cleared")
            if inc is None:
                continue
            inc, ev = self._emit(inc, now)
            out[key] = inc
            events.extend(ev)
        return out, events

    def _seen(
        self, old: Incident | None, key: IncidentKey, r: TargetResult, fs: list[Diagnosis], now: float,
        assume_held: bool,
    ) -> Incident:
        d = fs[0]
        fresh: dict[str, Any] = {
            "mode": d.mode,
            "labels": _labels(r, d),
            "rule_id": d.rule_id,
            "severity": d.severity,
            "summary": d.summary,
            "cause": d.cause,
            "confidence": d.confidence,
            "evidence": d.evidence,
            "triage": d.triage,
            "findings": tuple(Finding(x.mode, x.severity, x.rule_id, x.summary) for x in fs),
            "last_seen_at": now,
            "cleared_at": None,
            "blind_since": None,
            "blind_reason": "",
            "blind_announced": False,
        }
        need = self._required(d.mode)
        if old is None:
            start = now - need if assume_held else now
            inc = Incident(key=key, state=IncidentState.PENDING, started_at=start, **fresh)
        else:
            inc = replace(old, **fresh)
            if inc.state is IncidentState.PENDING and (old.mode is FailureMode.UNKNOWN) != (
                d.mode is FailureMode.UNKNOWN
            ):
                # a blind spot and a real condition wait for different things: restart the clock
                inc = replace(inc, started_at=now - need if assume_held else now)
        if inc.state is IncidentState.PENDING and now - inc.started_at + _EPS >= need:
            inc = replace(inc, state=IncidentState.FIRING, fired_at=now)
        return inc

    def _cleared(self, old: Incident, now: float, why: str) -> Incident | None:
        if old.state is IncidentState.PENDING:
            return None  # never fired: forget quietly
        cleared = old.cleared_at if old.cleared_at is not None else old.last_seen_at
        if old.blind_since is not None:
            cleared = now  # the clear evidence starts when the signals return, not before the blindness
        inc = replace(old, cleared_at=cleared, blind_since=None, blind_reason="", blind_announced=False)
        if now - cleared + _EPS >= self.config.hold_down:
            inc = replace(inc, state=IncidentState.RESOLVED, resolved_at=now, resolution=why)
        return inc

    def _blind(self, old: Incident, now: float, reason: str, expires: bool) -> tuple[Incident | None, list[Event]]:
        """Present but undecidable: hold the incident open (no silent resolve).

        A firing incident is marked blind (frozen) at once and announced once (one ``blind``
        event, unless silenced or never announced) when the blindness has lasted
        ``blind_notice_after``; nothing resolves, re-fires or reminds until the signals return. ``expires``
        (nothing could be evaluated at all): after ``forget_after`` since last seen it resolves as
        ``expired``; a mode left undecidable by some vanished signals is held open until they return.
        """
        forget = self.config.forget_after
        if expires and forget > 0 and now - old.last_seen_at + _EPS >= forget:
            if old.state is IncidentState.PENDING:
                return None, []
            return self._emit(replace(old, state=IncidentState.RESOLVED, resolved_at=now, resolution="expired"), now)
        if old.state is not IncidentState.FIRING or old.blind_announced:
            return old, []
        # held open (frozen) from the first blind evaluation; said in the thread only once the
        # blindness has lasted blind_notice_after (gone or back before that: nothing to say)
        inc = old if old.blind_since is not None else replace(
            old, blind_since=now, blind_reason=reason, cleared_at=None)
        assert inc.blind_since is not None
        if now - inc.blind_since + _EPS < self.config.blind_notice_after:
            return inc, []
        silenced = self.silenced(inc, now)
        inc = replace(inc, silenced=silenced, blind_announced=True)
        if silenced or not inc.event_emitted:
            return inc, []
        return inc, [Event(EventKind.BLIND, inc, now)]

    def _emit(self, inc: Incident, now: float) -> tuple[Incident, list[Event]]:
        silenced = self.silenced(inc, now)
        if silenced != inc.silenced:
            inc = replace(inc, silenced=silenced)
        if inc.state is IncidentState.RESOLVED:
            # an announced incident always gets its resolve, silenced or not, so no thread stays "firing"
            return inc, ([Event(EventKind.RESOLVE, inc, now)] if inc.event_emitted else [])
        if silenced or inc.state is IncidentState.PENDING:
            return inc, []
        if inc.cleared_at is not None or inc.blind_since is not None:
            return inc, []  # in hold-down, or blind: say nothing
        modes = tuple(f.mode for f in inc.findings) or (inc.mode,)
        if not inc.event_emitted:
            inc = replace(inc, last_event_at=now, event_severity=inc.severity, event_mode=inc.mode,
                          event_modes=modes)
            return inc, [Event(EventKind.FIRE, inc, now)]
        changes: list[str] = []
        prev_sev, prev_mode = inc.event_severity, inc.event_mode
        if prev_mode is not None and inc.mode is not prev_mode:
            changes.append(f"mode {prev_mode.value} → {inc.mode.value}")
        if prev_sev is not None and inc.severity.rank > prev_sev.rank:
            changes.append(f"severity {prev_sev.value} → {inc.severity.value}")
        new = [f for f in inc.findings[1:] if f.mode not in inc.event_modes]
        changes += [f"also {f.mode.value} ({f.severity.value}): {f.summary}" for f in new]
        if changes:
            top = inc.severity if prev_sev is None or inc.severity.rank > prev_sev.rank else prev_sev
            seen_modes = tuple(dict.fromkeys((*inc.event_modes, *modes)))
            inc = replace(inc, last_event_at=now, event_severity=top, event_mode=inc.mode,
                          event_modes=seen_modes)
            return inc, [Event(EventKind.UPDATE, inc, now, previous_severity=prev_sev, previous_mode=prev_mode,
                               changes=tuple(changes))]
        last = inc.last_event_at or now
        if self.config.reminder_interval > 0 and now - last + _EPS >= self.config.reminder_interval:
            inc = replace(inc, last_event_at=now)
            return inc, [Event(EventKind.REMIND, inc, now)]
        return inc, []


def _undecided(r: TargetResult, mode: FailureMode) -> str | None:
    """Why ``mode`` cannot be decided for this present target, or None when it is decided.

    With per-mode verdicts the incident's own mode decides (another mode's blindness does not
    hold it open); without them (KV usage missing or stale: nothing evaluated) an ``unknown``
    target is blind."""
    if mode is FailureMode.UNKNOWN:
        return None
    v = r.mode_verdict(mode)
    if v is None:
        return "no data (nothing could be evaluated)" if r.state is FailureMode.UNKNOWN else None
    if v.verdict is Verdict.UNDECIDABLE:
        return f"missing: {', '.join(v.blocking) or 'data'}"
    return None


def _silence_matches(s: Silence, labels: Mapping[str, str], now: float) -> bool:
    if s.until:
        try:
            if parse_time(s.until).timestamp() <= now:
                return False
        except ValueError:
            return False  # config validation is the place to complain; an unparsable end never silences
    return all(labels.get(k) == v for k, v in s.matchers.items())


def open_counts(incidents: Mapping[IncidentKey, Incident]) -> dict[tuple[str, str], int]:
    """Firing incidents by (primary mode, severity), for the ``kvwatch_incidents_open`` gauge."""
    out: dict[tuple[str, str], int] = {}
    for inc in incidents.values():
        if inc.state is IncidentState.FIRING:
            k = (inc.mode.value, inc.severity.value)
            out[k] = out.get(k, 0) + 1
    return out
