"""Scores of a hand-made timeline against hand-computed values, and the labels file format."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.core.models import FailureMode, Severity, Target, TargetKey
from kvwatch.errors import ConfigError
from kvwatch.tools.backtest.labels import Expected, Labels, load_labels
from kvwatch.tools.backtest.models import BacktestResult, IncidentRecord, TargetTimeline
from kvwatch.tools.backtest.scoring import score

H, F, OSC, IDLE = FailureMode.HEALTHY, FailureMode.FULL, FailureMode.OSCILLATING, FailureMode.IDLE
TIMES = tuple(float(60 * i) for i in range(10))  # steps 0, 60, ..., 540


def _tl(instance: str, states: list[FailureMode], incidents: tuple[IncidentRecord, ...] = ()) -> TargetTimeline:
    return TargetTimeline(Target(TargetKey("vllm", instance), "vllm-v1", "vllm"), TIMES, tuple(states), incidents)


def _inc(mode: FailureMode, opened: float, resolved: float | None) -> IncidentRecord:
    return IncidentRecord(mode, Severity.WARNING, f"{mode.value}-rule", opened - 60, opened, resolved)


RESULT = BacktestResult(
    start=0.0, end=540.0, step_s=60.0, window_s=1800.0, resolution_s=30.0, steps=TIMES,
    timelines=(
        _tl("a", [H, H, F, F, F, H, H, OSC, OSC, H], (_inc(F, 180, 420), _inc(OSC, 480, None))),
        _tl("b", [H] * 10, (_inc(IDLE, 150, 300),)),
        _tl("c", [F] * 10, (_inc(F, 0, None),)),  # unlabelled: must not count
    ),
)
LABELS = Labels(
    {
        "a": (Expected(60, 300, F), Expected(500, 600, F)),
        "vllm/b": (Expected(0, 120, IDLE),),
        "gone:1": (Expected(0, 60, F),),
    },
    grace_s=60.0,
)


def test_scores_match_hand_computed_values() -> None:
    s = score(RESULT, LABELS)
    assert s["targets"] == 2
    assert s["unlabelled_targets"] == ["vllm/c"]
    assert s["labelled_but_not_found"] == ["gone:1"]
    assert list(s["modes"]) == ["full", "oscillating", "idle"]  # precedence order, healthy excluded
    full, osc, idle = (s["modes"][m] for m in ("full", "oscillating", "idle"))
    # a: full predicted at 120,180,240 (all expected); expected also at 60 and 540 → fn 2
    assert full["steps"] == {"tp": 3, "fp": 0, "fn": 2, "precision": 1.0, "recall": 0.6}
    # one incident (180→420) matches [60,300); nothing overlaps [500,600)
    assert full["incidents"] == {"expected": 2, "detected": 1, "raised": 1, "true": 1, "precision": 1.0, "recall": 0.5}
    assert full["detection_s"] == {"mean": 120.0, "max": 120.0, "values": [120.0]}
    assert full["reset_s"] == {"mean": 120.0, "max": 120.0, "values": [120.0], "open": 0}
    # oscillating at 420,480: never expected
    assert osc["steps"] == {"tp": 0, "fp": 2, "fn": 0, "precision": 0.0, "recall": None}
    assert osc["incidents"]["precision"] == 0.0 and osc["incidents"]["recall"] is None
    assert osc["detection_s"]["values"] == []
    # b: idle expected at 0 and 60 but healthy predicted; its incident fires 30 s after the interval (grace 60 s)
    assert idle["steps"] == {"tp": 0, "fp": 0, "fn": 2, "precision": None, "recall": 0.0}
    assert idle["incidents"]["recall"] == 1.0 and idle["incidents"]["precision"] == 1.0
    assert idle["detection_s"]["values"] == [150.0] and idle["reset_s"]["values"] == [180.0]


def test_without_grace_a_late_incident_is_a_false_positive() -> None:
    strict = Labels(LABELS.targets, grace_s=0.0)
    idle = score(RESULT, strict)["modes"]["idle"]["incidents"]
    assert idle == {"expected": 1, "detected": 0, "raised": 1, "true": 0, "precision": 0.0, "recall": 0.0}


def test_still_open_incident_counts_as_open_reset() -> None:
    labels = Labels({"a": (Expected(400, 600, OSC),)})
    osc = score(RESULT, labels)["modes"]["oscillating"]
    assert osc["incidents"]["detected"] == 1 and osc["detection_s"]["values"] == [80.0]
    assert osc["reset_s"]["open"] == 1 and osc["reset_s"]["values"] == []


def test_labels_file_yaml_and_errors(tmp_path: Path) -> None:
    ok = tmp_path / "l.yaml"
    ok.write_text("grace: 2m\ntargets:\n  pod-0:8000:\n    - {from: 2026-11-29T10:00:00Z, to: '1795947300', mode: full}\n")
    lab = load_labels(ok)
    assert lab.grace_s == 120.0
    [e] = lab.targets["pod-0:8000"]
    assert (e.start, e.end, e.mode) == (1795946400.0, 1795947300.0, F)
    flat = tmp_path / "l.json"
    flat.write_text('{"x:1": [{"from": 10, "to": 20, "mode": "idle"}]}')
    assert load_labels(flat).targets == {"x:1": (Expected(10, 20, IDLE),)}
    bad = tmp_path / "bad.yaml"
    bad.write_text("targets:\n  p:\n    - {from: 20, to: 10, mode: full}\n    - {from: 1, to: 2, mode: jammed}\n    - {from: 1}\n")
    with pytest.raises(ConfigError) as exc:
        load_labels(bad)
    text = str(exc.value)
    assert "targets.p[0].to: must be after from" in text
    assert "targets.p[1].mode: got 'jammed'" in text
    assert "targets.p[2]: expected keys from, to, mode" in text
