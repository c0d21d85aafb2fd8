"""JSON and text rendering of an evaluation: strict JSON (never NaN), contract keys, order."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.results import AT
from support.results import target_result as result

from kvwatch.core.models import (
    Evaluation,
    FailureMode,
    TargetResult,
)
from kvwatch.core.report import to_json, to_text

FLOATS = st.floats(allow_nan=True, allow_infinity=True)


def strict_loads(text: str) -> dict:
    def reject(const: str) -> None:
        raise AssertionError(f"JSON contains {const}")

    return json.loads(text, parse_constant=reject)


def evaluation(*results: TargetResult) -> Evaluation:
    return Evaluation(evaluated_at=AT, results=results, window_s=1800.0, queries=42)


def test_json_contract_keys() -> None:
    doc = strict_loads(to_json(evaluation(result(FailureMode.FULL))))
    assert doc["evaluated_at"] == "2026-11-29T10:00:00Z"
    (t,) = doc["targets"]
    assert t["labels"] == {"job": "vllm", "instance": "10.0.0.1:8000", "model": "meta-llama/Llama-3.1-8B-Instruct"}
    assert (t["engine"], t["state"]) == ("vllm", "full")
    (d,) = t["diagnoses"]
    assert {"mode", "severity", "confidence", "summary", "evidence", "triage"} <= set(d)
    assert d["evidence"][0] == {"signal": "kv_usage", "stat": "frac_above(0.9)", "observed": 0.97, "op": ">=",
                                "threshold": 0.8, "window": "10m", "passed": True, "lower_bound": False}
    assert d["triage"] == ["one", "two"]
    assert t["missing_signals"] == ["waiting_capacity", "max_running (no data)"]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_become_null_not_nan(bad: float) -> None:
    r = result(FailureMode.FULL, observed=bad, confidence=bad, threshold=bad,
               facts={"capacity_tokens": bad, "headroom_tokens": 5.0})
    text = to_json(evaluation(r))
    doc = strict_loads(text)
    d = doc["targets"][0]["diagnoses"][0]
    assert d["confidence"] is None and d["evidence"][0]["observed"] is None and d["evidence"][0]["threshold"] is None
    assert doc["targets"][0]["facts"] == {"capacity_tokens": None, "headroom_tokens": 5.0}
    assert "NaN" not in text and "Infinity" not in text


@settings(max_examples=50)
@given(st.dictionaries(st.sampled_from(["capacity_tokens", "period", "kv_cycles"]), FLOATS), FLOATS)
def test_json_is_always_strict(facts: dict[str, float], observed: float) -> None:
    strict_loads(to_json(evaluation(result(FailureMode.MISREAD, observed=observed, facts=facts))))


def test_empty_fleet() -> None:
    doc = strict_loads(to_json(evaluation()))
    assert doc["targets"] == [] and doc["evaluated_at"] == "2026-11-29T10:00:00Z"
    assert "0 targets" in to_text(evaluation())


def test_text_shows_state_target_and_first_step() -> None:
    text = to_text(evaluation(result(FailureMode.FULL)))
    assert "full" in text and "vllm/10.0.0.1:8000" in text and "first: one" in text
    assert "42 queries" in text
    # signals that blocked no decision (harmless blind spots) are JSON-only
    assert "blind:" not in text and "waiting_capacity" not in text


def test_text_shows_only_blind_spots_that_blocked_a_decision() -> None:
    r = result(FailureMode.UNKNOWN)
    r = TargetResult(r.target, r.state, r.diagnoses, ("ttft_p99", "waiting_capacity"), r.facts, blocking=("ttft_p99",))
    text = to_text(evaluation(r))
    assert "blind: ttft_p99 (blocked a decision)" in text and "waiting_capacity" not in text
    doc = strict_loads(to_json(evaluation(r)))["targets"][0]
    assert doc["blind_spots"] == {"blocking": ["ttft_p99"], "harmless": ["waiting_capacity"]}
    assert doc["missing_signals"] == ["ttft_p99", "waiting_capacity"]


def test_text_survives_nan_everywhere() -> None:
    r = result(FailureMode.FULL, observed=math.nan, confidence=math.nan, facts={"capacity_tokens": math.nan})
    assert "vllm/10.0.0.1:8000" in to_text(evaluation(r))
