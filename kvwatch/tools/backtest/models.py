"""What a backtest produces: per target a state timeline and the incidents that would have fired.

Times are Unix seconds internally and RFC 3339 in JSON. A timeline holds one
entry per evaluated step (oldest first); ``changes()`` gives the compact form
(an entry each time the state changes) used in JSON and text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kvwatch.core.frame import FleetData
from kvwatch.core.models import FailureMode, Severity, Target


def iso(ts: float | None) -> str | None:
    """Unix seconds → RFC 3339 UTC (``None`` stays ``None``)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class ModeChange:
    """From ``at`` (Unix s) on, the incident's primary mode was ``mode``, found by ``rule``."""

    at: float
    mode: FailureMode
    rule: str

    def to_json(self) -> dict[str, Any]:
        return {"at": iso(self.at), "mode": self.mode.value, "rule": self.rule}


@dataclass(frozen=True)
class IncidentRecord:
    """An incident that fired. ``resolved_at`` is ``None`` when it was still open at ``T1``.

    ``pending_at`` is when the condition first matched; ``opened_at`` when it fired
    (as decided by :class:`kvwatch.alerting.lifecycle.Lifecycle`). One incident covers an
    engine's episode and takes the most severe mode found during it, so ``mode``/``rule`` are
    the last primary mode; ``modes`` lists every one it carried, oldest first (the first is
    the mode it opened with, at ``opened_at``; empty when built without a history).
    """

    mode: FailureMode
    severity: Severity
    rule: str
    pending_at: float
    opened_at: float
    resolved_at: float | None = None
    resolution: str = ""
    modes: tuple[ModeChange, ...] = ()

    def active_until(self, end: float) -> float:
        return end if self.resolved_at is None else self.resolved_at

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "severity": self.severity.value,
            "opened_at": iso(self.opened_at),
            "resolved_at": iso(self.resolved_at),
            "rule": self.rule,
            "pending_at": iso(self.pending_at),
            "resolution": self.resolution,
            "modes": [c.to_json() for c in self.modes],
        }


@dataclass(frozen=True)
class TargetTimeline:
    """One target's replay: ``times[i]`` → ``states[i]`` at every evaluated step."""

    target: Target
    times: tuple[float, ...]
    states: tuple[FailureMode, ...]
    incidents: tuple[IncidentRecord, ...] = ()

    def changes(self) -> list[tuple[float, FailureMode]]:
        out: list[tuple[float, FailureMode]] = []
        for t, s in zip(self.times, self.states, strict=True):
            if not out or out[-1][1] is not s:
                out.append((t, s))
        return out

    def state_at(self, t: float) -> FailureMode | None:
        """State of the last step at or before ``t`` (``None`` before the first step)."""
        best: FailureMode | None = None
        for ts, s in zip(self.times, self.states, strict=True):
            if ts > t + 1e-6:
                break
            best = s
        return best

    @property
    def last_state(self) -> FailureMode | None:
        return self.states[-1] if self.states else None

    def to_json(self) -> dict[str, Any]:
        return {
            "labels": self.target.labels,
            "engine": self.target.engine,
            "dialect": self.target.dialect,
            **({"gone": True} if self.target.gone else {}),
            "timeline": [{"at": iso(t), "state": s.value} for t, s in self.changes()],
            "last_state": None if self.last_state is None else self.last_state.value,
            "incidents": [i.to_json() for i in self.incidents],
        }


@dataclass(frozen=True)
class BacktestResult:
    """The whole replay: span, steps, timelines and cost figures."""

    start: float
    end: float
    step_s: float
    window_s: float
    resolution_s: float
    steps: tuple[float, ...]
    timelines: tuple[TargetTimeline, ...]
    queries: int = 0
    scores: dict[str, Any] | None = None
    #: the fetched history (for charts); not part of the JSON
    history: FleetData | None = field(default=None, repr=False, compare=False)

    def timeline(self, instance: str) -> TargetTimeline | None:
        for tl in self.timelines:
            if tl.target.key.instance == instance or str(tl.target.key) == instance:
                return tl
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "from": iso(self.start),
            "to": iso(self.end),
            "step": self.step_s,
            "window_seconds": self.window_s,
            "resolution_seconds": self.resolution_s,
            "evaluations": len(self.steps),
            "queries": self.queries,
            "targets": [tl.to_json() for tl in self.timelines],
            "scores": self.scores or {},
        }
