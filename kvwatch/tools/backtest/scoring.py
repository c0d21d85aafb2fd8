"""Alert-quality scores of a backtest against labelled expected modes (the SRE-workbook attributes).

Per failure mode, over the labelled targets only:

* **step-wise** precision/recall of the state timeline: at every evaluated step
  the expected set is the modes of the intervals containing it (``healthy``
  outside all intervals); a step predicting mode *m* is a true positive when *m*
  is expected, a false positive otherwise; a step expecting *m* but predicting
  something else is a false negative.
* **incident-wise**: an incident of mode *m* matches an expected interval of *m*
  on its target when its firing period ``[opened_at, resolved_at or T1]``
  overlaps ``[from, to + grace]``. Precision = matching incidents / incidents
  raised; recall = intervals with a match / expected intervals overlapping the span.
* **detection time**: interval start → first matching incident fired (0 if it
  was already firing); **reset time**: interval end → last matching incident
  resolved (counted as ``open`` while unresolved at ``T1``).

Ratios with an empty denominator are ``None`` (nothing to score), never 0 or 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvwatch.core.models import FailureMode
from kvwatch.tools.backtest.labels import Expected, Labels
from kvwatch.tools.backtest.models import BacktestResult, IncidentRecord, TargetTimeline


def _ratio(a: int, b: int) -> float | None:
    return None if b == 0 else a / b


def _summary(values: list[float]) -> dict[str, Any]:
    return {
        "mean": None if not values else sum(values) / len(values),
        "max": None if not values else max(values),
        "values": values,
    }


@dataclass
class _Tally:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    expected: int = 0
    detected: int = 0
    raised: int = 0
    true: int = 0
    detection: list[float] = field(default_factory=list)
    reset: list[float] = field(default_factory=list)
    still_open: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": {
                "tp": self.tp, "fp": self.fp, "fn": self.fn,
                "precision": _ratio(self.tp, self.tp + self.fp),
                "recall": _ratio(self.tp, self.tp + self.fn),
            },
            "incidents": {
                "expected": self.expected, "detected": self.detected, "raised": self.raised, "true": self.true,
                "precision": _ratio(self.true, self.raised),
                "recall": _ratio(self.detected, self.expected),
            },
            "detection_s": _summary(self.detection),
            "reset_s": {**_summary(self.reset), "open": self.still_open},
        }


def _matches(inc: IncidentRecord, e: Expected, grace_s: float, end: float) -> bool:
    return inc.mode is e.mode and inc.opened_at <= e.end + grace_s and inc.active_until(end) >= e.start


def _score_steps(tl: TargetTimeline, expected: tuple[Expected, ...], tallies: dict[FailureMode, _Tally]) -> None:
    for t, pred in zip(tl.times, tl.states, strict=True):
        want = {e.mode for e in expected if e.contains(t)} or {FailureMode.HEALTHY}
        for mode, tally in tallies.items():
            if pred is mode:
                if mode in want:
                    tally.tp += 1
                else:
                    tally.fp += 1
            elif mode in want:
                tally.fn += 1


def _score_incidents(
    tl: TargetTimeline, expected: tuple[Expected, ...], tallies: dict[FailureMode, _Tally], grace_s: float,
    start: float, end: float,
) -> None:
    for inc in tl.incidents:
        tally = tallies[inc.mode]
        tally.raised += 1
        tally.true += any(_matches(inc, e, grace_s, end) for e in expected)
    for e in expected:
        if e.mode not in tallies or e.end <= start or e.start > end:
            continue  # outside the replayed span: nothing could have fired
        tally = tallies[e.mode]
        tally.expected += 1
        hits = [inc for inc in tl.incidents if _matches(inc, e, grace_s, end)]
        if not hits:
            continue
        tally.detected += 1
        tally.detection.append(max(0.0, min(i.opened_at for i in hits) - e.start))
        if any(i.resolved_at is None for i in hits):
            tally.still_open += 1
        else:
            tally.reset.append(max(i.resolved_at for i in hits if i.resolved_at is not None) - e.end)


def scored_modes(result: BacktestResult, labels: Labels, timelines: Iterable[TargetTimeline]) -> list[FailureMode]:
    """Modes labelled or predicted (states or incidents), healthy excluded, in precedence order."""
    modes = {e.mode for exp in labels.targets.values() for e in exp}
    for tl in timelines:
        modes |= set(tl.states) | {i.mode for i in tl.incidents}
    modes.discard(FailureMode.HEALTHY)
    return sorted(modes, key=lambda m: m.rank)


def score(result: BacktestResult, labels: Labels) -> dict[str, Any]:
    """Per-mode step-wise and incident-wise precision/recall, detection and reset times (seconds)."""
    labelled: list[tuple[TargetTimeline, tuple[Expected, ...]]] = []
    unlabelled: list[str] = []
    for tl in result.timelines:
        exp = labels.for_target(tl.target.key.job, tl.target.key.instance)
        if exp is None:
            unlabelled.append(str(tl.target.key))
        else:
            labelled.append((tl, exp))
    found = {str(tl.target.key) for tl, _ in labelled} | {tl.target.key.instance for tl, _ in labelled}
    missing = sorted(name for name in labels.targets if name not in found)
    modes = scored_modes(result, labels, [tl for tl, _ in labelled])
    tallies = {m: _Tally() for m in modes}
    for tl, exp in labelled:
        _score_steps(tl, exp, tallies)
        _score_incidents(tl, exp, tallies, labels.grace_s, result.start, result.end)
    return {
        "targets": len(labelled),
        "unlabelled_targets": unlabelled,
        "labelled_but_not_found": missing,
        "grace_s": labels.grace_s,
        "modes": {m.value: tallies[m].to_json() for m in modes},
    }
