"""The vocabulary shared by every stage: targets, failure modes, diagnoses, results.

These are plain frozen dataclasses: the diagnosis core builds them, and the JSON,
text, Slack and Alertmanager renderers read the same objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple


class FailureMode(StrEnum):
    """Primary states; declaration order is the precedence order (first wins)."""

    FULL = "full"
    OSCILLATING = "oscillating"
    FRAGMENTED = "fragmented"
    MISREAD = "misread"
    IDLE = "idle"
    HEALTHY = "healthy"
    UNKNOWN = "unknown"

    @property
    def rank(self) -> int:
        return _MODE_RANK[self]

    def __str__(self) -> str:
        return self.value


_MODE_RANK: dict[FailureMode, int] = {m: i for i, m in enumerate(FailureMode)}
PRECEDENCE: tuple[FailureMode, ...] = tuple(m for m in FailureMode if m is not FailureMode.UNKNOWN)


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return list(Severity).index(self)

    def __str__(self) -> str:
        return self.value


class TargetKey(NamedTuple):
    """Identity of one engine instance: Prometheus ``job`` and ``instance`` labels.

    A named tuple, not a dataclass: it keys most of kvwatch's dicts and sets (~140,000 hashes
    per steady 1,000-target cycle), and a tuple hashes and compares in C where a frozen
    dataclass calls Python-level ``__hash__``/``__eq__``. Same hash (of ``(job, instance)``),
    fields, immutability and ``repr``; it also equals a plain ``(job, instance)`` tuple, so
    never mix the two as keys of one mapping.
    """

    job: str
    instance: str

    def __str__(self) -> str:
        return f"{self.job}/{self.instance}" if self.job else self.instance


def target_key(labels: Mapping[str, object]) -> TargetKey:
    """The target a series' labels name (missing labels read as empty strings)."""
    return TargetKey(str(labels.get("job", "")), str(labels.get("instance", "")))


@dataclass(frozen=True)
class Target:
    """A discovered engine instance and the metric names Prometheus holds for it."""

    key: TargetKey
    dialect: str
    engine: str
    model: str = ""
    names: frozenset[str] = frozenset()
    #: no longer scraped: ``up`` is absent for it (deleted pod, rollout, dropped from discovery);
    #: unlike a blind target (present, signals missing) its incidents resolve as "gone"
    gone: bool = False

    @property
    def labels(self) -> dict[str, str]:
        out = {"job": self.key.job, "instance": self.key.instance}
        if self.model:
            out["model"] = self.model
        return out

    def instance_hint(self) -> str:
        return f"instance {self.key.instance!r} (job {self.key.job!r}, dialect {self.dialect})"

    @property
    def group(self) -> tuple[str, str]:
        """Replica group for imbalance checks: same job and model."""
        return (self.key.job, self.model)


class Evidence(NamedTuple):
    """One observed value against its threshold, over a window.

    A NamedTuple rather than a frozen dataclass: the core builds one per evaluated
    condition per target, and a frozen dataclass costs several times more to create.
    """

    signal: str
    stat: str
    observed: float | None
    op: str
    threshold: float
    window: str
    passed: bool
    #: ``observed`` is only a lower bound (a quantile past the last histogram bucket)
    lower_bound: bool = False

    def describe(self) -> str:
        obs = "n/a" if self.observed is None else f"{'> ' if self.lower_bound else ''}{self.observed:.4g}"
        return f"{self.signal}.{self.stat} = {obs} ({self.op} {self.threshold:g} over {self.window})"

    def to_json(self) -> dict[str, Any]:
        return {
            "signal": self.signal,
            "stat": self.stat,
            "observed": self.observed,
            "op": self.op,
            "threshold": self.threshold,
            "window": self.window,
            "passed": self.passed,
            "lower_bound": self.lower_bound,
        }


@dataclass(frozen=True)
class Diagnosis:
    """A matched rule for one target: what, how sure, why, and what to do in order."""

    mode: FailureMode
    rule_id: str
    severity: Severity
    confidence: float
    summary: str
    evidence: tuple[Evidence, ...]
    triage: tuple[str, ...]
    cause: str = ""
    for_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": self.mode.value,
            "rule": self.rule_id,
            "severity": self.severity.value,
            "confidence": round(self.confidence, 3),
            "summary": self.summary,
            "evidence": [e.to_json() for e in self.evidence],
            "triage": list(self.triage),
        }
        if self.cause:
            out["cause"] = self.cause
        return out


class Verdict(StrEnum):
    """Three-valued outcome of a rule or a mode for one target."""

    MATCHED = "matched"
    NOT_MATCHED = "not_matched"
    UNDECIDABLE = "undecidable"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Condition:
    """One evaluated rule condition, for ``kvwatch explain``: observed vs threshold and the outcome.

    ``met`` is None when the condition could not be decided (signal missing or no samples);
    ``bound`` is ">" when ``observed`` is only a lower bound (a quantile past the last bucket).
    """

    path: str
    name: str
    stat: str
    window: str
    op: str
    threshold: float | None
    observed: float | None
    met: bool | None
    guard: bool = False
    negated: bool = False
    bound: str = ""
    note: str = ""

    def describe(self) -> str:
        obs = "n/a" if self.observed is None else f"{self.bound}{self.observed:.4g}"
        thr = "n/a" if self.threshold is None else f"{self.threshold:g}"
        outcome = {True: "met", False: "not met", None: "undecidable"}[self.met]
        head = f"{'not ' if self.negated else ''}{self.name}.{self.stat} over {self.window}"
        tail = f" ({self.note})" if self.note else ""
        return f"{head}: {obs} {self.op} {thr} → {outcome}{tail}"


@dataclass(frozen=True)
class RuleCheck:
    """One rule's outcome for one target: verdict, the signals that left it undecidable, and
    whether the known evidence points to it (a non-guard condition met, none failed)."""

    rule_id: str
    mode: FailureMode
    cause: str
    verdict: Verdict
    unknown: tuple[str, ...] = ()
    points: bool = False
    conditions: tuple[Condition, ...] = ()
    #: outcome of each top-level condition of the rule (explain: "2 of 3 conditions met")
    parts: tuple[bool | None, ...] = ()


@dataclass(frozen=True)
class ModeVerdict:
    """One failure mode for one target: matched / not matched / undecidable.

    ``rules`` are the matched rules (matched) or the undecidable ones (undecidable);
    ``blocking`` the signals whose absence left it undecidable; ``points``: the known
    evidence points to this mode (e.g. KV pinned while the pressure signals are missing).
    """

    mode: FailureMode
    verdict: Verdict
    rules: tuple[str, ...] = ()
    blocking: tuple[str, ...] = ()
    points: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"verdict": self.verdict.value, "rules": list(self.rules)}
        if self.verdict is Verdict.UNDECIDABLE:
            out["blocking_signals"] = list(self.blocking)
            out["evidence_points_to_it"] = self.points
        return out


@dataclass(frozen=True)
class TargetResult:
    """Everything kvwatch concluded about one target at one instant.

    ``missing_signals`` lists every signal the target lacks (compatibility field);
    ``blocking`` the ones that blocked a decision (the rest are harmless blind spots);
    ``modes`` the three-valued verdict of every failure mode; ``checks`` every rule's
    outcome (conditions are filled only when explaining).
    """

    target: Target
    state: FailureMode
    diagnoses: tuple[Diagnosis, ...]
    missing_signals: tuple[str, ...]
    facts: dict[str, float | None] = field(default_factory=dict)
    modes: tuple[ModeVerdict, ...] = ()
    blocking: tuple[str, ...] = ()
    checks: tuple[RuleCheck, ...] = ()

    @property
    def harmless(self) -> tuple[str, ...]:
        """Missing signals that blocked no decision (e.g. not exported by this engine version)."""
        return tuple(m for m in self.missing_signals if m.split(" ")[0] not in self.blocking and not m.startswith("rule "))

    def mode_verdict(self, mode: FailureMode) -> ModeVerdict | None:
        for v in self.modes:
            if v.mode is mode:
                return v
        return None

    @property
    def primary(self) -> Diagnosis | None:
        for d in self.diagnoses:
            if d.mode is self.state:
                return d
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "labels": self.target.labels,
            "engine": self.target.engine,
            "dialect": self.target.dialect,
            "state": self.state.value,
            "diagnoses": [d.to_json() for d in self.diagnoses],
            "missing_signals": list(self.missing_signals),
            "blind_spots": {"blocking": list(self.blocking), "harmless": list(self.harmless)},
            "modes": {v.mode.value: v.to_json() for v in self.modes},
            **({"gone": True} if self.target.gone else {}),
            "facts": {k: (None if v is None else round(v, 6)) for k, v in self.facts.items()},
        }


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of the fleet at ``evaluated_at``."""

    evaluated_at: datetime
    results: tuple[TargetResult, ...]
    window_s: float
    queries: int = 0
    warnings: tuple[str, ...] = ()
    #: the rate window used (the configured one, widened to 4 scrape intervals), s
    rate_window_s: float = 0.0
    #: the scrape interval detected from the data, s (None: not measured)
    scrape_interval_s: float | None = None
    #: targets scraped slower than the fleet → the rate window their counters were read with, s
    target_rate_windows: Mapping[TargetKey, float] = field(default_factory=dict)
    #: kvwatch's own remarks on the configuration against the data (e.g. an SLO inside a bucket)
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "evaluated_at": self.evaluated_at.isoformat().replace("+00:00", "Z"),
            "window_seconds": self.window_s,
            "rate_window_seconds": self.rate_window_s or None,
            "scrape_interval_seconds": self.scrape_interval_s,
            # job/instance of a target scraped slower than the fleet → its own rate window
            "rate_window_seconds_by_target": {f"{k.job}/{k.instance}": v
                                              for k, v in sorted(self.target_rate_windows.items())},
            "targets": [r.to_json() for r in self.results],
            "queries": self.queries,
            "warnings": list(self.warnings),
            "notes": list(self.notes),
        }
