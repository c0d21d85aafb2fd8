"""Render a :class:`~kvwatch.tools.backtest.models.BacktestResult` as JSON or as a readable per-target report."""

from __future__ import annotations

import json
from typing import Any

from kvwatch.durations import format_duration
from kvwatch.textsafe import safe_label
from kvwatch.tools.backtest.models import BacktestResult, iso


def to_json(result: BacktestResult) -> str:
    return json.dumps(result.to_json(), indent=2, allow_nan=False, default=str) + "\n"


def _dur(seconds: float | None) -> str:
    return "open" if seconds is None else format_duration(max(0.0, seconds))


def _short(ts: float | None) -> str:
    s = iso(ts)
    return "-" if s is None else s.replace("T", " ").removesuffix("Z")


def _scores_text(scores: dict[str, Any]) -> list[str]:
    lines = ["", f"Scores against labels ({scores.get('targets', 0)} labelled targets):"]

    def pct(x: float | None) -> str:
        return "  n/a" if x is None else f"{x:5.0%}"

    def secs(x: float | None) -> str:
        return "n/a" if x is None else format_duration(x)

    lines.append(f"  {'mode':<12} {'step P':>6} {'step R':>6} {'inc P':>6} {'inc R':>6}  detection (mean/max)  reset (mean/max)")
    for mode, s in scores.get("modes", {}).items():
        st, inc = s["steps"], s["incidents"]
        det, rst = s["detection_s"], s["reset_s"]
        lines.append(
            f"  {mode:<12} {pct(st['precision']):>6} {pct(st['recall']):>6} {pct(inc['precision']):>6} "
            f"{pct(inc['recall']):>6}  {secs(det['mean']):>8}/{secs(det['max']):<10}  "
            f"{secs(rst['mean']):>7}/{secs(rst['max'])}"
        )
    return lines


def to_text(result: BacktestResult) -> str:
    """Per target: state changes, then incidents (open → resolve, mode, severity, rule)."""
    n_inc = sum(len(tl.incidents) for tl in result.timelines)
    lines = [
        f"kvwatch backtest — {len(result.timelines)} targets, {_short(result.start)} → {_short(result.end)} UTC, "
        f"step {format_duration(result.step_s)} ({len(result.steps)} evaluations, window "
        f"{format_duration(result.window_s)}), {n_inc} incidents, {result.queries} queries",
        "",
    ]
    for tl in result.timelines:
        lines.append(f"{safe_label(str(tl.target.key), 200)}  {safe_label(f'{tl.target.engine}/{tl.target.dialect}', 60)}")
        changes = tl.changes()
        for i, (t, state) in enumerate(changes):
            if i + 1 < len(changes):
                lines.append(f"    {_short(t)}  {state.value:<12} for {_dur(changes[i + 1][0] - t)}")
            else:
                lines.append(f"    {_short(t)}  {state.value:<12} until the end")
        for inc in tl.incidents:
            end = "still open" if inc.resolved_at is None else f"resolved {_short(inc.resolved_at)}"
            lasted = _dur(None if inc.resolved_at is None else inc.resolved_at - inc.opened_at)
            lines.append(
                f"    ! {inc.mode.value} [{inc.severity.value}] fired {_short(inc.opened_at)}, {end} "
                f"({lasted}; rule {inc.rule}, pending since {_short(inc.pending_at)})"
            )
        lines.append("")
    if result.scores:
        lines.extend(_scores_text(result.scores))
    return "\n".join(lines).rstrip() + "\n"
