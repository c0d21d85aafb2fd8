"""Alert lifecycle: a pure state machine per (target, mode). No clock, no I/O.

``pending`` → ``firing`` once the condition has held for the rule's ``for``
(:attr:`Diagnosis.for_s`) plus ``lifecycle.pending_for``; ``firing`` →
``resolved`` once it has been clear for ``hold_down`` (a re-match during the
hold-down keeps it firing and sends nothing). Events: ``fire``, ``update``
(severity escalated), ``remind`` (every ``reminder_interval`` while firing),
``resolve``. Silences (label matchers) suppress fire/update/remind; the
incident is still tracked, and an incident already announced still gets its
resolve. A target that is ``unknown`` (blind spot) or absent from the results
freezes its open incidents: nothing resolves and nothing is sent until data
returns (or until ``forget_after`` without data, then it resolves as *gone*).
A blind spot is itself an incident of mode ``unknown`` (warning) once it has
persisted for ``blind_spot_for``.

An incident is never resolved by blindness: when the target is still scraped but its
mode became undecidable (the signals that decided it vanished), a firing incident stays
open and is marked blind (``blind_since``, one ``blind`` event) until the signals return;
clearing is then measured from their return.
"""

from __future__ import annotations

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
    """One incident per target (``job``, ``instance``) and failure mode."""

    job: str
    instance: str
    mode: FailureMode

    @property
    def target(self) -> TargetKey:
        return TargetKey(self.job, self.instance)

    def __str__(self) -> str:
        return f"{self.job}/{self.instance}/{self.mode.value}"

    @classmethod
    def parse(cls, text: str) -> IncidentKey:
        job, rest = text.split("/", 1)
        instance, mode = rest.rsplit("/", 1)
        return cls(job, instance, FailureMode(mode))


@dataclass(frozen=True)
class Incident:
    """One tracked condition. Times are Unix seconds; ``None`` means "not yet"."""

    key: IncidentKey
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
    fired_at: float | None = None
    cleared_at: float | None = None
    resolved_at: float | None = None
    #: when the lifecycle last created an event for it (fire/update/remind); not delivery:
    #: sinks deliver events later, through the outbox
    last_event_at: float | None = None
    #: the severity its last fire/update event announced
    event_severity: Severity | None = None
    silenced: bool = False
    #: why it resolved: "cleared" or "gone" (no data for forget_after)
    resolution: str = ""
    #: since when the mode cannot be decided (its signals vanished); None while it can
    blind_since: float | None = None
    #: the signals whose absence leaves the mode undecidable
    blind_reason: str = ""

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    @property
    def event_emitted(self) -> bool:
        """A fire event was created for this occurrence (so its resolution is told too)."""
        return self.last_event_at is not None

    @property
    def uid(self) -> str:
        """This occurrence (a recurrence after resolution has a new ``started_at``, so a new uid)."""
        return f"{self.key}@{self.started_at:.3f}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": str(self.key),
            "state": self.state.value,
            "labels": dict(self.labels),
            "rule_id": self.rule_id,
            "severity": self.severity.value,
            "summary": self.summary,
            "cause": self.cause,
            "confidence": self.confidence,
            "evidence": [e.to_json() for e in self.evidence],
            "triage": list(self.triage),
            "silenced": self.silenced,
            "resolution": self.resolution,
            "blind_reason": self.blind_reason,
            "event_severity": self.event_severity.value if self.event_severity else None,
        }
        for name in (
            "started_at", "last_seen_at", "fired_at", "cleared_at", "resolved_at", "last_event_at", "blind_since",
        ):
            out[name] = getattr(self, name)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Incident:
        return cls(
            key=IncidentKey.parse(d["key"]),
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
            fired_at=d.get("fired_at"),
            cleared_at=d.get("cleared_at"),
            resolved_at=d.get("resolved_at"),
            # state files written before the rename hold last_notified_at / notified_severity
            last_event_at=d.get("last_event_at", d.get("last_notified_at")),
            event_severity=Severity(sev) if (sev := d.get("event_severity", d.get("notified_severity"))) else None,
            silenced=d.get("silenced", False),
            resolution=d.get("resolution", ""),
            blind_since=d.get("blind_since"),
            blind_reason=d.get("blind_reason", ""),
        )


@dataclass(frozen=True)
class Event:
    """Something to tell people about ``incident`` (its state after the step) at ``at``."""

    kind: EventKind
    incident: Incident
    at: float
    previous_severity: Severity | None = None

    @property
    def id(self) -> str:
        """Stable identity: the same event is never queued twice."""
        return f"{self.incident.uid}:{self.kind.value}@{self.at:.3f}"

    def to_json(self) -> dict[str, Any]:
        prev = self.previous_severity.value if self.previous_severity else None
        return {"kind": self.kind.value, "at": self.at, "previous_severity": prev, "incident": self.incident.to_json()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Event:
        prev = Severity(d["previous_severity"]) if d.get("previous_severity") else None
        return cls(EventKind(d["kind"]), Incident.from_json(d["incident"]), d["at"], prev)


def is_incident(d: Diagnosis) -> bool:
    """Only warnings and worse of a non-healthy mode are incidents."""
    return d.mode is not FailureMode.HEALTHY and d.severity.rank >= Severity.WARNING.rank


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

    def _required(self, d: Diagnosis) -> float:
        # A rule's own `for` is already enforced inside the evaluation: its conditions
        # are computed over the last `for` of the window, so a match means the
        # condition has held that long. Counting it again across cycles would double
        # the detection delay. Only the extra `pending_for` and a blind spot's
        # duration (which no rule window measures) are counted here.
        base = self.config.blind_spot_for if d.mode is FailureMode.UNKNOWN else 0.0
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
        required duration already (``once --notify``: the rule's window is the
        only evidence there will be). Incidents resolved in a previous step are
        dropped; a recurrence after resolution is a new incident.
        """
        seen = {r.target.key: r for r in results}
        active: dict[IncidentKey, tuple[TargetResult, Diagnosis]] = {}
        for r in results:
            for d in r.diagnoses:
                if is_incident(d):
                    active.setdefault(IncidentKey(r.target.key.job, r.target.key.instance, d.mode), (r, d))
        out: dict[IncidentKey, Incident] = {}
        events: list[Event] = []
        for key in sorted(set(incidents) | set(active)):
            old = incidents.get(key)
            if old is not None and old.state is IncidentState.RESOLVED:
                old = None
            if key in active:
                r, d = active[key]
                inc = self._seen(old, key, r, d, now, assume_held)
            elif old is None:
                continue
            else:
                res = seen.get(key.target)
                undecided = None if res is None else _undecided(res, key.mode)
                if undecided is not None:
                    inc, ev = self._blind(old, now, undecided)
                    out[key] = inc
                    events.extend(ev)
                    continue
                # a mode decided not matched clears, whatever the target state (e.g. `unknown` for
                # another mode); without per-mode verdicts nothing was decided: freeze
                blind = res is None or (
                    res.state is FailureMode.UNKNOWN and key.mode is not FailureMode.UNKNOWN and not res.modes
                )
                inc = self._frozen(old, now) if blind else self._cleared(old, now)
                if inc is None:
                    continue
            inc, ev = self._emit(old, inc, now)
            out[key] = inc
            events.extend(ev)
        return out, events

    def _seen(
        self, old: Incident | None, key: IncidentKey, r: TargetResult, d: Diagnosis, now: float, assume_held: bool
    ) -> Incident:
        fresh = {
            "labels": _labels(r, d),
            "rule_id": d.rule_id,
            "severity": d.severity,
            "summary": d.summary,
            "cause": d.cause,
            "confidence": d.confidence,
            "evidence": d.evidence,
            "triage": d.triage,
            "last_seen_at": now,
            "cleared_at": None,
            "blind_since": None,
            "blind_reason": "",
        }
        need = self._required(d)
        if old is None:
            start = now - need if assume_held else now
            inc = Incident(key=key, state=IncidentState.PENDING, started_at=start, **fresh)
        else:
            inc = replace(old, **fresh)
        if inc.state is IncidentState.PENDING and now - inc.started_at + _EPS >= need:
            inc = replace(inc, state=IncidentState.FIRING, fired_at=now)
        return inc

    def _cleared(self, old: Incident, now: float) -> Incident | None:
        if old.state is IncidentState.PENDING:
            return None  # never fired: forget quietly
        cleared = old.cleared_at if old.cleared_at is not None else old.last_seen_at
        if old.blind_since is not None:
            cleared = now  # the clear evidence starts when the signals return, not before the blindness
        inc = replace(old, cleared_at=cleared, blind_since=None, blind_reason="")
        if now - cleared + _EPS >= self.config.hold_down:
            inc = replace(inc, state=IncidentState.RESOLVED, resolved_at=now, resolution="cleared")
        return inc

    def _blind(self, old: Incident, now: float, reason: str) -> tuple[Incident, list[Event]]:
        """The target is scraped but this mode cannot be decided: hold the incident open.

        A firing incident is marked blind once (one ``blind`` event, unless silenced or never
        announced); nothing resolves, re-fires or reminds until the signals return.
        """
        if old.state is not IncidentState.FIRING or old.blind_since is not None:
            return old, []
        inc = replace(old, blind_since=now, blind_reason=reason, cleared_at=None)
        silenced = self.silenced(inc, now)
        if silenced != inc.silenced:
            inc = replace(inc, silenced=silenced)
        if silenced or not inc.event_emitted:
            return inc, []
        return inc, [Event(EventKind.BLIND, inc, now)]

    def _frozen(self, old: Incident, now: float) -> Incident | None:
        """No data for this target: keep the incident exactly as it is (no silent resolve)."""
        forget = self.config.forget_after
        if forget > 0 and now - old.last_seen_at + _EPS >= forget:
            if old.state is IncidentState.PENDING:
                return None
            return replace(old, state=IncidentState.RESOLVED, resolved_at=now, resolution="gone")
        return old

    def _emit(self, old: Incident | None, inc: Incident, now: float) -> tuple[Incident, list[Event]]:
        frozen = old is not None and old is inc
        silenced = self.silenced(inc, now)
        if silenced != inc.silenced:
            inc = replace(inc, silenced=silenced)
        if inc.state is IncidentState.RESOLVED:
            # an announced incident always gets its resolve, silenced or not, so no thread stays "firing"
            return inc, ([Event(EventKind.RESOLVE, inc, now)] if inc.event_emitted else [])
        if silenced or inc.state is IncidentState.PENDING:
            return inc, []
        if inc.cleared_at is not None or frozen:
            return inc, []  # in hold-down, or frozen without data: say nothing
        if not inc.event_emitted:
            inc = replace(inc, last_event_at=now, event_severity=inc.severity)
            return inc, [Event(EventKind.FIRE, inc, now)]
        prev = inc.event_severity
        if prev is not None and inc.severity.rank > prev.rank:
            inc = replace(inc, last_event_at=now, event_severity=inc.severity)
            return inc, [Event(EventKind.UPDATE, inc, now, previous_severity=prev)]
        last = inc.last_event_at or now
        if self.config.reminder_interval > 0 and now - last + _EPS >= self.config.reminder_interval:
            inc = replace(inc, last_event_at=now)
            return inc, [Event(EventKind.REMIND, inc, now)]
        return inc, []


def _undecided(res: TargetResult, mode: FailureMode) -> str | None:
    """Why ``mode`` cannot be decided for this (scraped) target, or None when it can.

    A result without per-mode verdicts (KV usage missing or stale: the target may be gone)
    is not handled here; it freezes the incident until data returns or ``forget_after``.
    """
    if mode is FailureMode.UNKNOWN:
        return None
    v = res.mode_verdict(mode)
    if v is None:
        return None  # no mode was evaluated (KV usage missing or stale): the frozen/gone path
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
    """Firing incidents by (mode, severity), for the ``kvwatch_incidents_open`` gauge."""
    out: dict[tuple[str, str], int] = {}
    for inc in incidents.values():
        if inc.state is IncidentState.FIRING:
            k = (inc.key.mode.value, inc.severity.value)
            out[k] = out.get(k, 0) + 1
    return out
