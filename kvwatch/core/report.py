"""Render an :class:`~kvwatch.core.models.Evaluation` as JSON or as a readable on-call table.

Text output shows label values from engines and scrape configs: every such value
goes through :func:`~kvwatch.textsafe.printable` (a newline in a label cannot
fake a row, an ANSI escape cannot recolour the terminal), and the target column
is capped at :data:`TARGET_WIDTH` so one long instance does not pad every row.
"""

from __future__ import annotations

import json
import math
from typing import Any

from kvwatch.core.models import Evaluation, FailureMode, TargetResult
from kvwatch.core.templates import Num
from kvwatch.textsafe import clip_width, printable, safe_label

#: widest target column (job/instance); longer ones end in …
TARGET_WIDTH = 60
#: longest shown summary / triage step / warning line
LINE_WIDTH = 1000

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
        label += f" ({safe_label(d.cause, 40)})"
    return label


def _key_evidence(r: TargetResult) -> str:
    d = r.primary
    if d is None:
        return ""
    return safe_label(d.summary, LINE_WIDTH)


def to_text(ev: Evaluation, *, color: bool = False, verbose: bool = True) -> str:
    """A table (state, target, key evidence, first triage step), most urgent first."""
    lines = [f"kvwatch — {len(ev.results)} targets at {ev.evaluated_at.isoformat().replace('+00:00', 'Z')} "
             f"(window {ev.window_s / 60:g}m, {ev.queries} queries)"]
    counts: dict[str, int] = {}
    for r in ev.results:
        counts[r.state.value] = counts.get(r.state.value, 0) + 1
    lines.append("  " + "  ".join(f"{_ICON[FailureMode(k)]} {k}: {v}" for k, v in counts.items()))
    lines.append("")
    keys = {id(r): safe_label(str(r.target.key), TARGET_WIDTH) for r in ev.results}
    width = max([len(k) for k in keys.values()] + [6])
    for r in ev.results:
        d = r.primary
        conf = f"{Num(d.confidence if d else None):.0%}" if d else ""
        engine = safe_label(f"{r.target.engine}/{r.target.dialect}", 40)
        head = f"{_ICON[r.state]} {_state_label(r):<24} {keys[id(r)]:<{width}}  {engine}"
        if d and d.severity.value != "info":
            head += f"  [{d.severity.value}, confidence {conf}]"
        lines.append(head)
        if not verbose and r.state in (FailureMode.HEALTHY,):
            continue
        if d is not None:
            lines.append(f"    why:   {_key_evidence(r)}")
            if r.state is not FailureMode.HEALTHY:
                lines.append(f"    first: {safe_label(d.triage[0], LINE_WIDTH)}")
                for i, step in enumerate(d.triage[1:], start=2):
                    if verbose:
                        lines.append(f"    {i}.    {safe_label(step, LINE_WIDTH)}")
        others = [x for x in r.diagnoses if x is not d]
        if others:
            also = "; ".join(f"{x.mode.value} ({x.rule_id})" for x in others)
            lines.append("    also:  " + safe_label(also, LINE_WIDTH))
        # only the blind spots that blocked a decision; harmless ones (a signal this engine
        # version does not export, that left no decision open) are in the JSON
        if r.blocking and verbose:
            lines.append(f"    blind: {safe_label(', '.join(r.blocking), LINE_WIDTH)} (blocked a decision)")
        lines.append("")
    if ev.warnings:
        lines.append("Prometheus warnings: " + clip_width(printable("; ".join(ev.warnings)), LINE_WIDTH))
    for note in ev.notes:
        lines.append("Note: " + clip_width(printable(note), LINE_WIDTH))
    return "\n".join(lines).rstrip() + "\n"
