"""Hand-built evaluation results for the rendering tests (report text and JSON, terminal safety)."""

from __future__ import annotations

from datetime import UTC, datetime

from kvwatch.core.models import (
    Diagnosis,
    Evidence,
    FailureMode,
    Severity,
    Target,
    TargetKey,
    TargetResult,
)

#: the evaluation instant of every hand-built result
AT = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def target_result(
    state: FailureMode = FailureMode.FULL,
    *,
    job: str = "vllm",
    instance: str = "10.0.0.1:8000",
    model: str = "meta-llama/Llama-3.1-8B-Instruct",
    stat: str = "frac_above(0.9)",
    observed: float | None = 0.97,
    threshold: float = 0.8,
    confidence: float = 0.8,
    summary: str = "KV pinned.",
    triage: tuple[str, ...] = ("one", "two"),
    missing: tuple[str, ...] = ("waiting_capacity", "max_running (no data)"),
    facts: dict[str, float | None] | None = None,
) -> TargetResult:
    """One vLLM V1 target diagnosed ``state`` by the critical rule ``<state>-rule`` on one
    passed ``kv_usage`` evidence (``stat`` >= ``threshold`` over 10m). ``facts`` None: a
    capacity of 131072 tokens and no period (pass ``{}`` for none)."""
    t = Target(TargetKey(job, instance), "vllm-v1", "vllm", model)
    ev = Evidence("kv_usage", stat, observed, ">=", threshold, "10m", True)
    d = Diagnosis(state, f"{state}-rule", Severity.CRITICAL, confidence, summary, (ev,), triage)
    return TargetResult(t, state, (d,), missing,
                        facts if facts is not None else {"capacity_tokens": 131072.0, "period": None})
