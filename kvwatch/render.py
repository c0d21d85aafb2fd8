"""Render an :class:`~kvwatch.models.Evaluation` as JSON or as a readable on-call table."""

from __future__ import annotations

import json
import math
from typing import Any

from kvwatch.models import Evaluation, FailureMode, TargetResult
from kvwatch.render_template import Num

_ICON = {
    FailureMode.FULL: "🔴",
    FailureMode.OSCILLATING: "🟠",
    FailureMode.FRAGMENTED: "🟠",
    FailureMode.MISREAD: "🟡",
    FailureMode.IDLE: "🔵",
    FailureMode.HEALTHY: "🟢",
    FailureMode.UNKNOWN: "⚪",
}


def _finite(obj: Any) -> Any:
    """NaN/±Inf → None (JSON has no such numbers; a missing value is null, never a fake 0)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def to_json(ev: Evaluation) -> str:
    return json.dumps(_finite(ev.to_json()), indent=2, sort_keys=False, allow_nan=False, default=str)


def _state_label(r: TargetResult) -> str:
    d = r.primary
    label = r.state.value
    if d is not None and d.cause:
        label += f" ({d.cause})"
    return label


def _key_evidence(r: TargetResult) -> str:
    d = r.primary
    if d is None:
        return ""
    return d.summary


def to_text(ev: Evaluation, *, color: bool = False, verbose: bool = True) -> str:
    """A table (state, target, key evidence, first triage step), most urgent first."""
    lines = [f"kvwatch — {len(ev.results)} targets at {ev.evaluated_at.isoformat().replace('+00:00', 'Z')} "
             f"(window {ev.window_s / 60:g}m, {ev.queries} queries)"]
    counts: dict[str, int] = {}
    for r in ev.results:
        counts[r.state.value] = counts.get(r.state.value, 0) + 1
    lines.append("  " + "  ".join(f"{_ICON[FailureMode(k)]} {k}: {v}" for k, v in counts.items()))
    lines.append("")
    width = max([len(str(r.target.key)) for r in ev.results] + [6])
    for r in ev.results:
        d = r.primary
        conf = f"{Num(d.confidence if d else None):.0%}" if d else ""
        head = f"{_ICON[r.state]} {_state_label(r):<24} {r.target.key!s:<{width}}  {r.target.engine}/{r.target.dialect}"
        if d and d.severity.value != "info":
            head += f"  [{d.severity.value}, confidence {conf}]"
        lines.append(head)
        if not verbose and r.state in (FailureMode.HEALTHY,):
            continue
        if d is not None:
            lines.append(f"    why:   {_key_evidence(r)}")
            if r.state is not FailureMode.HEALTHY:
                lines.append(f"    first: {d.triage[0]}")
                for i, step in enumerate(d.triage[1:], start=2):
                    if verbose:
                        lines.append(f"    {i}.    {step}")
        others = [x for x in r.diagnoses if x is not d]
        if others:
            lines.append("    also:  " + "; ".join(f"{x.mode.value} ({x.rule_id})" for x in others))
        gaps = [m for m in r.missing_signals if not m.startswith("rule ")]
        if gaps and verbose:
            lines.append(f"    blind: {', '.join(gaps)}")
        lines.append("")
    if ev.warnings:
        lines.append("Prometheus warnings: " + "; ".join(ev.warnings))
    return "\n".join(lines).rstrip() + "\n"
