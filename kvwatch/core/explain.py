"""``kvwatch explain TARGET``: every rule, every condition, observed against threshold.

For one target this prints the state and why, the three-valued verdict of every mode,
and per rule each condition with its observed value, threshold and outcome (met / not
met / undecidable), how many of the rule's top-level conditions held, and the near
misses — conditions that failed by less than :data:`NEAR_MISS` of their threshold.
This is how thresholds are tuned and how a miss is debugged.
"""

from __future__ import annotations

from typing import Any

from kvwatch.core.models import Condition, Evaluation, RuleCheck, TargetKey, TargetResult, Verdict
from kvwatch.durations import format_duration
from kvwatch.textsafe import safe_label

#: a failed condition within this fraction of its threshold is a near miss
NEAR_MISS = 0.15

_MARK = {True: "✓", False: "✗", None: "?"}


def explain_keys(keys: list[TargetKey], pattern: str) -> frozenset[TargetKey]:
    """The targets to explain: ``job/instance`` or ``instance`` equal to ``pattern``, else containing it."""
    exact = [k for k in keys if pattern in (str(k), k.instance)]
    return frozenset(exact or [k for k in keys if pattern in str(k)])


def near_miss(c: Condition) -> float | None:
    """Relative shortfall of a failed condition (0.03 = 3 % short of its threshold), or None.

    Only plain conditions (not inside ``not``) with a non-zero threshold can be near misses:
    0 preemptions against "> 0.0001" is no preemption at all, not almost some.
    """
    if c.met is not False or c.negated or c.observed is None or not c.threshold:
        return None
    gap = abs(c.observed - c.threshold) / abs(c.threshold)
    return gap if gap <= NEAR_MISS else None


def _cond_text(c: Condition) -> str:
    obs = "n/a" if c.observed is None else f"{c.bound}{c.observed:.4g}"
    thr = "n/a" if c.threshold is None else f"{c.threshold:g}"
    stat = f"{c.name}" if c.stat == "value" else f"{c.name}.{c.stat}"
    where = "" if c.window == "now" else f" over {c.window}"
    return f"{stat}{where}: {obs} {c.op} {thr}"


_GROUP_HEAD = {"all": "all of:", "any": "any of:", "not": "not:"}


def group_headers(path: str, seen: set[str]) -> list[tuple[int, str]]:
    """Headers of the nested groups a condition sits in, each once per rule, with their depth.

    ``path`` is the condition's place in the rule (``when.all[7].not.all[0].any[1]``); the
    node at ``when.all[7]`` is a ``not`` because its child segment is ``not``, and so on.
    Depth 0 is a top-level part of the rule. Printing the groups keeps alternatives such as
    ``any: [gen_tps > 0, all: [gen_tps <= 0, completion > 0]]`` from reading as a contradiction.
    """
    segs = path.split(".")[1:]
    out: list[tuple[int, str]] = []
    for k in range(1, len(segs)):
        prefix = ".".join(segs[:k])
        if prefix not in seen:
            seen.add(prefix)
            out.append((k - 1, _GROUP_HEAD[segs[k].split("[")[0]]))
    return out


def rule_line(rc: RuleCheck) -> str:
    """``full-kv-pressure (full): not matched — 2 of 3 conditions met; near miss: kv_usage.p10 …``."""
    held = sum(p is True for p in rc.parts)
    head = f"{rc.rule_id} ({rc.mode.value}{f', {rc.cause}' if rc.cause else ''}): {rc.verdict.value.replace('_', ' ')}"
    head += f" — {held} of {len(rc.parts)} conditions met"
    misses = [c for c in rc.conditions if near_miss(c) is not None]
    if misses:
        head += "; near miss: " + ", ".join(_cond_text(c) for c in misses)
    if rc.verdict is Verdict.UNDECIDABLE:
        head += f"; undecidable without {', '.join(rc.unknown)}"
        if rc.points:
            head += " (the known evidence points to it)"
    return head


def _own_window(r: TargetResult, ev: Evaluation) -> str:
    """``; rate window 4m, scraped slower than the fleet (2m)`` for such a target, else empty."""
    own = ev.target_rate_windows.get(r.target.key)
    if own is None:
        return ""
    return f"; rate window {format_duration(own)}, scraped slower than the fleet ({format_duration(ev.rate_window_s)})"


def explain_text(r: TargetResult, ev: Evaluation) -> str:
    at = ev.evaluated_at.isoformat().replace("+00:00", "Z")
    d = r.primary
    lines = [
        # the target's labels come from the engine: escaped so a newline or ANSI code cannot forge output
        f"kvwatch explain {safe_label(str(r.target.key), 200)} at {at} (window {ev.window_s / 60:g}m; "
        f"{safe_label(f'{r.target.engine}/{r.target.dialect}', 60)}{_own_window(r, ev)})",
        f"state: {r.state.value}" + (f" ({d.cause})" if d and d.cause else "") + (f" — {d.summary}" if d else ""),
        "modes: " + ", ".join(f"{v.mode.value} {v.verdict.value.replace('_', ' ')}" for v in r.modes),
        "",
    ]
    for rc in r.checks:
        lines.append(rule_line(rc))
        seen: set[str] = set()
        for c in rc.conditions:
            lines.extend(f"    {'  ' * depth}{head}" for depth, head in group_headers(c.path, seen))
            indent = "    " + "  " * max(0, c.path.count(".") - 1)
            mark = _MARK[c.met]
            extra = []
            if c.negated:
                extra.append("inside `not`: the rule needs that group false")
            if c.guard:
                extra.append("guard")
            if c.note:
                extra.append(c.note)
            gap = near_miss(c)
            if gap is not None:
                extra.append(f"near miss, {gap:.0%} short")
            tail = f"  ({'; '.join(extra)})" if extra else ""
            outcome = {True: "met", False: "not met", None: "undecidable"}[c.met]
            lines.append(f"{indent}{mark} {_cond_text(c)} → {outcome}{tail}")
        lines.append("")
    if r.blocking:
        lines.append(f"blind spots that blocked a decision: {', '.join(r.blocking)}")
    if r.harmless:
        lines.append(f"harmless blind spots (blocked no decision): {', '.join(r.harmless)}")
    return "\n".join(lines).rstrip() + "\n"


def explain_json(r: TargetResult) -> dict[str, Any]:
    out = r.to_json()
    out["rules"] = [
        {
            "rule": rc.rule_id,
            "mode": rc.mode.value,
            "cause": rc.cause,
            "verdict": rc.verdict.value,
            "conditions_met": sum(p is True for p in rc.parts),
            "conditions": len(rc.parts),
            "undecidable_without": list(rc.unknown),
            "evidence_points_to_it": rc.points,
            "checks": [
                {
                    "path": c.path, "signal": c.name, "stat": c.stat, "window": c.window,
                    "op": c.op, "threshold": c.threshold, "observed": c.observed,
                    "observed_is_lower_bound": c.bound == ">", "negated": c.negated, "guard": c.guard,
                    "outcome": {True: "met", False: "not_met", None: "undecidable"}[c.met],
                    "near_miss": near_miss(c) is not None, "note": c.note,
                }
                for c in rc.conditions
            ],
        }
        for rc in r.checks
    ]
    return out
