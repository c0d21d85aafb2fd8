"""The pure diagnosis core: (fleet data, rules) → one result per target.

No network, clock or Slack here: everything arrives as arguments, so this module
is tested with plain arrays. Conditions use three-valued logic: a statistic that
cannot be computed (signal not exported, no samples) is *unknown*, never 0, and
a rule matches only when its condition is definitely true. A rule that cannot be
decided for lack of data is reported as a blind spot.
"""

from __future__ import annotations

import functools
import math
import operator
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from kvwatch.features import SeriesStats, safe_ratio
from kvwatch.fleetdata import FleetData
from kvwatch.fleetstats import VECTOR_STATS, FleetStats
from kvwatch.models import (
    Condition,
    Diagnosis,
    Evidence,
    FailureMode,
    RuleCheck,
    Severity,
    Target,
    TargetKey,
    TargetResult,
    Verdict,
)
from kvwatch.render_template import Num, render
from kvwatch.ruleset import DERIVED_INPUTS, SIGNAL_NAMES, Group, Leaf, Rule, RuleSet
from kvwatch.signals import REQUIRED_SIGNALS, Signal
from kvwatch.verdicts import PERSISTENT_QUEUE_SPAN_S, StateDecision, decide, mode_verdicts

_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne}

_ALL_SIGNALS: tuple[Signal, ...] = tuple(Signal)  # iterating an Enum class is slow
_NEGATE = {">": "<=", ">=": "<", "<": ">=", "<=": ">", "==": "!=", "!=": "=="}

#: span over which group (replica) comparisons are made, seconds
GROUP_SPAN_S = 600.0


@dataclass(frozen=True)
class Params:
    """Evaluation parameters that are not rules: the instant, spans and SLOs (seconds)."""

    at: float
    window_s: float
    step_s: float
    ttft_slo_s: float = 2.0

    @property
    def fresh_s(self) -> float:
        """How recent "now" is: a target with no KV sample in this span is stale (≥ 5 min,
        Prometheus' default lookback, and at least three evaluation steps)."""
        return max(3 * self.step_s, 300.0)


class TargetView:
    """Lazy statistics of one target over named spans (``for`` tails and the whole window)."""

    def __init__(
        self, target: Target, data: FleetData, params: Params, fleet: FleetStats | None = None
    ) -> None:
        self.target = target
        self.key = target.key
        self.data = data
        self.p = params
        self.fleet = fleet if fleet is not None else FleetStats([target.key], data, params.at)
        self.row = self.fleet.row[target.key]
        self._cache: dict[tuple[str, float], SeriesStats] = {}
        self._starts: dict[float, int] = {}

    def stat(self, name: str, span_s: float, stat: str, arg: float | None = None) -> float | None:
        """One statistic of a signal over the last ``span_s`` seconds (None: not computable).

        Fleet-wide vectorised where possible (one numpy pass answers every target),
        per series otherwise (swings, periodogram).
        """
        if stat in VECTOR_STATS:
            vec = self.fleet.vector(name, span_s, stat, arg)
            if vec is None:
                return None
            x = float(vec[self.row])
            return x if math.isfinite(x) else None
        st = self.stats(name, span_s)
        return None if st is None else st.stat(stat, arg)

    def raw(self, name: str) -> np.ndarray | None:
        """This target's row of a canonical or derived signal (derived ones are defined once,
        in :meth:`FleetStats.matrix`)."""
        m = self.fleet.matrix(name)
        return None if m is None else m[self.row]

    def stats(self, name: str, span_s: float) -> SeriesStats | None:
        key = (name, span_s)
        st = self._cache.get(key)
        if st is None:
            v = self.raw(name)
            if v is None:
                return None
            i0 = self._start(span_s)
            st = self._cache[key] = SeriesStats(self.data.grid[i0:], v[i0:], len(v) - i0)
        return st

    def _start(self, span_s: float) -> int:
        """Index of the first grid point inside (at − span, at]; the grid is sorted."""
        i0 = self._starts.get(span_s)
        if i0 is None:
            i0 = self._starts[span_s] = int(np.searchsorted(self.data.grid, self.p.at - span_s - 1e-6, side="right"))
        return i0


def _group_facts(views: list[TargetView]) -> dict[TargetKey, dict[str, float | None]]:
    """Replica-imbalance facts: each target against the others of its (job, model) group."""
    groups: dict[tuple[str, str], list[tuple[TargetKey, float]]] = defaultdict(list)
    for v in views:
        mean = v.stat("kv_usage", GROUP_SPAN_S, "mean")
        if mean is not None and v.target.model:
            groups[v.target.group].append((v.key, mean))
    out: dict[TargetKey, dict[str, float | None]] = {}
    for members in groups.values():
        n = len(members)
        order = sorted(range(n), key=lambda i: members[i][1])
        srt = [members[i][1] for i in order]
        mean = sum(srt) / n
        for k, i in enumerate(order):  # k: this member's position in the sorted means
            key, mine = members[i]
            med = _median_without(srt, k) if n > 1 else None
            out[key] = {
                "group_size": float(n),
                "group_kv_usage_median": med,
                "group_kv_usage_mean": mean,
                "kv_usage_vs_group": None if med is None else mine - med,
            }
    return out


def _median_without(srt: list[float], k: int) -> float:
    """Median of sorted ``srt`` without its element ``k``, in O(1) (groups can be large)."""
    m = len(srt) - 1

    def at(j: int) -> float:
        return srt[j] if j < k else srt[j + 1]

    return (at((m - 1) // 2) + at(m // 2)) / 2


def facts_for(view: TargetView, group: dict[str, float | None]) -> dict[str, float | None]:
    """Scalar facts used by rules and triage text: capacity math and headroom in tokens and requests."""
    p = view.p
    w = p.window_s
    cap = view.stat("kv_capacity_tokens", w, "last")
    u_now = view.stat("kv_usage", p.fresh_s, "last")
    used = None if cap is None or u_now is None else cap * u_now
    headroom = None if cap is None or u_now is None else cap * (1 - u_now)
    prompt, gen, reqs = (view.stat(s, w, "mean") for s in ("prompt_tps", "gen_tps", "request_rate"))
    per_req = None if prompt is None or gen is None else safe_ratio(prompt + gen, reqs)
    # the periodogram and the swing walk are per series: only swinging pools need them
    swinging = (view.stat("kv_usage", w, "std") or 0.0) >= 0.05
    ws = view.stats("kv_usage", w) if swinging else None
    period = ws.period if ws is not None and (ws.periodicity or 0) >= 0.2 else None
    cycles = ws.cycles(0.8, 0.4) if ws is not None else (0 if view.stat("kv_usage", w, "count") else None)
    return {
        "capacity_tokens": cap,
        "used_tokens": used,
        "headroom_tokens": headroom,
        "tokens_per_request": per_req,
        "headroom_requests": safe_ratio(headroom, per_req),
        "capacity_requests": safe_ratio(cap, per_req),
        "max_running": view.stat("max_running", w, "last"),
        "ttft_slo": p.ttft_slo_s,
        "period": period,
        "period_minutes": None if period is None else period / 60,
        "kv_cycles": None if cycles is None else float(cycles),
        "group_size": 1.0,
        "group_kv_usage_median": None,
        "group_kv_usage_mean": None,
        "kv_usage_vs_group": None,
        **group,
    }


#: latency signals: with no request finished in the span they have no samples, and a
#: "latency is high" condition is then decided false (nobody waited), not undecidable
LATENCY_SIGNALS = frozenset(
    {"ttft_p50", "ttft_p99", "ttft_mean", "queue_p99", "queue_mean", "itl_p99", "ttft_tail_ratio"}
)


class _Eval:
    """Evaluates one rule's condition tree for one target, collecting evidence.

    Three-valued (Kleene) logic: a condition whose statistic cannot be computed is
    unknown. ``points`` records whether a non-guard condition was met (the known evidence
    points to the rule). With ``explain`` every condition is evaluated (no short-circuit)
    and recorded.
    """

    def __init__(self, view: TargetView, rule: Rule, facts: dict[str, float | None], explain: bool = False) -> None:
        self.view, self.rule, self.facts = view, rule, facts
        self.evidence: list[Evidence] = []
        self.margins: list[float] = []
        self.unknown: set[str] = set()
        self.points = False
        self.explain = explain
        self.conditions: list[Condition] = []
        self.parts: list[bool | None] = []

    def span(self, leaf: Leaf) -> float:
        return self.view.p.window_s if leaf.over == "window" else min(self.rule.for_, self.view.p.window_s)

    def _no_requests(self, span: float) -> bool:
        """True when the target is known to have finished no request in the span."""
        top = self.view.stat("request_rate", span, "max")
        return top is not None and top <= 0.0

    def leaf(self, leaf: Leaf, negated: bool = False, path: str = "") -> bool | None:
        thr = leaf.threshold(self.facts)
        if leaf.fact is not None:
            obs, name, stat, window = self.facts.get(leaf.fact), leaf.fact, "value", "now"
            span = 0.0
        else:
            assert leaf.signal is not None
            span = self.span(leaf)
            obs = self.view.stat(leaf.signal, span, leaf.stat, leaf.arg)
            name, window = leaf.signal, _fmt_span(span)
            stat = leaf.stat if leaf.arg is None else f"{leaf.stat}({leaf.arg:g})"
        if obs is None or thr is None or not math.isfinite(obs):
            note = ""
            if leaf.missing != "unknown":
                result: bool | None = leaf.missing == "true"
                note = f"no data, counts as {leaf.missing}"
            elif name in LATENCY_SIGNALS and leaf.op in (">", ">=") and self._no_requests(span):
                result, note = False, "no request finished: no latency to be high"
            else:
                self.unknown.add(name)
                result = None
            self._record(path, name, stat, window, leaf, thr, None, result, negated, note)
            return result
        ok = bool(_OPS[leaf.op](obs, thr))
        # under `not`, a leaf that fails is what supports the diagnosis
        supports = ok != negated
        op = leaf.op if not negated else _NEGATE[leaf.op]
        self.evidence.append(Evidence(name, stat, obs, op, thr, window, supports))
        if supports:
            self.margins.append(min(1.0, abs(obs - thr) / max(abs(thr), 0.05)))
            if not negated and not leaf.guard:
                self.points = True
        self._record(path, name, stat, window, leaf, thr, obs, ok, negated, "")
        return ok

    def _record(
        self, path: str, name: str, stat: str, window: str, leaf: Leaf, thr: float | None,
        obs: float | None, met: bool | None, negated: bool, note: str,
    ) -> None:
        if self.explain:
            self.conditions.append(
                Condition(path, name, stat, window, leaf.op, thr, obs, met, leaf.guard, negated, "", note)
            )

    def node(self, n: Group | Leaf, negated: bool = False, path: str = "when") -> bool | None:
        if isinstance(n, Leaf):
            return self.leaf(n, negated, path)
        if n.not_ is not None:
            r = self.node(n.not_, not negated, f"{path}.not")
            return None if r is None else not r
        # short-circuit: a False child decides `all`, a True child decides `any`,
        # whatever the unknown siblings would say (three-valued logic)
        decisive = n.all is None
        kind = "all" if n.all is not None else "any"
        unknown = False
        decided = False
        for i, child in enumerate(n.all or n.any or ()):
            r = self.node(child, negated, f"{path}.{kind}[{i}]")
            if path == "when":
                self.parts.append(r)
            if r is decisive:
                decided = True
                if not self.explain:
                    return decisive
            unknown = unknown or r is None
        if decided:
            return decisive
        return None if unknown else not decisive


@functools.lru_cache(maxsize=64)
def _fmt_span(seconds: float) -> str:
    return f"{seconds / 60:g}m" if seconds >= 60 else f"{seconds:g}s"


class _Stats:
    """Template view of one signal's statistics over one span: ``{kv_usage.mean:.0%}``."""

    __slots__ = ("_name", "_span", "_view")

    def __init__(self, view: TargetView, name: str, span: float) -> None:
        self._view, self._name, self._span = view, name, span

    def __getattr__(self, stat: str) -> Num:
        try:
            return Num(self._view.stat(self._name, self._span, stat))
        except (AttributeError, KeyError, TypeError):
            return Num(None)  # not a statistic: the template renders n/a


class _Context(dict):  # type: ignore[type-arg]
    """Template context that builds signal views on demand (most templates use a few)."""

    def __init__(self, view: TargetView, span_s: float, facts: dict[str, float | None]) -> None:
        super().__init__({k: Num(v) for k, v in facts.items()})
        self.view, self.span = view, span_s
        self["for_minutes"] = Num(span_s / 60)
        self["window_minutes"] = Num(view.p.window_s / 60)

    def __missing__(self, key: str) -> object:
        if key == "window":
            return _Window(self.view)
        if key in SIGNAL_NAMES:
            return _Stats(self.view, key, self.span)
        raise KeyError(key)


class _Window:
    __slots__ = ("_view",)

    def __init__(self, view: TargetView) -> None:
        self._view = view

    def __getattr__(self, name: str) -> _Stats:
        return _Stats(self._view, name, self._view.p.window_s)


def _confidence(ev: _Eval, coverage: float) -> float:
    base = 0.5 + 0.5 * (sum(ev.margins) / len(ev.margins) if ev.margins else 0.0)
    return round(max(0.05, min(1.0, base * (0.5 + 0.5 * coverage))), 3)


def _healthy(view: TargetView) -> Diagnosis:
    w = view.p.window_s
    usage = Num(view.stat("kv_usage", w, "mean"))
    p90 = Num(view.stat("kv_usage", w, "p90"))
    waiting = Num(view.stat("waiting", w, "mean"))
    return Diagnosis(
        mode=FailureMode.HEALTHY,
        rule_id="healthy",
        severity=Severity.INFO,
        confidence=0.9,
        summary=f"KV {usage:.0%} used on average (p90 {p90:.0%}), {waiting:.1f} waiting, no failure-mode signature.",
        evidence=(),
        triage=("No action needed: busy pools at 60-85% with no queue and no preemptions are healthy.",),
    )


def _unknown(view: TargetView, reason: str, severity: Severity = Severity.WARNING) -> Diagnosis:
    return Diagnosis(
        mode=FailureMode.UNKNOWN,
        rule_id="blind-spot",
        severity=severity,
        confidence=1.0,
        summary=f"Blind spot: {reason}; kvwatch cannot tell this target's state.",
        evidence=(),
        triage=(
            f"Check that {view.target.instance_hint()} is scraped and exports KV-cache metrics "
            "(vLLM: vllm:kv_cache_usage_perc; SGLang: --enable-metrics; TensorRT-LLM: enable_iter_perf_stats).",
            "Check the discovery selector and that the engine version's metric names are supported (kvwatch check).",
        ),
    )


def _undecided(view: TargetView, decision: StateDecision, structural: bool) -> Diagnosis:
    """The ``unknown`` diagnosis of a target whose rules could not all be decided.

    Warning (an incident once it persists) when the blindness may hide a problem; info
    when the only gap is a signal this engine version does not export at all.
    """
    severity = Severity.WARNING if decision.urgent or not structural else Severity.INFO
    sigs = ", ".join(decision.blocking)
    return Diagnosis(
        mode=FailureMode.UNKNOWN,
        rule_id="undecidable",
        severity=severity,
        confidence=1.0,
        summary=f"Undecidable: {decision.reason}; kvwatch will not call this target healthy.",
        evidence=(),
        triage=(
            f"Restore the missing signals{f' ({sigs})' if sigs else ''}: check that {view.target.instance_hint()} "
            "still exports them and that no relabel rule or selector drops them (kvwatch check).",
            "If this engine version never exports them, enable them where the engine can (e.g. Triton "
            "--metrics-config histogram_latencies=true for TTFT) or upgrade the engine.",
            "Run `kvwatch explain` on this target to see every condition that could not be decided.",
        ),
    )


def _signal_inputs(name: str) -> tuple[str, ...]:
    return DERIVED_INPUTS.get(name, (name,))


def diagnose_target(
    view: TargetView, rules: RuleSet, group: dict[str, float | None], explain: bool = False
) -> TargetResult:
    """Classify one target. ``group`` holds replica facts computed across the fleet;
    ``explain`` records every condition of every rule (``kvwatch explain``)."""
    p = view.p
    sourced = view.data.sourced.get(view.key, set())
    missing: list[str] = []
    for sig in _ALL_SIGNALS:
        if sig not in sourced:
            missing.append(sig.value)
        elif not view.stat(sig.value, p.window_s, "count"):
            missing.append(f"{sig.value} (no data)")
    facts = facts_for(view, group)

    def blind(reason: str, blocking: tuple[str, ...]) -> TargetResult:
        return TargetResult(
            view.target, FailureMode.UNKNOWN, (_unknown(view, reason),), tuple(missing), facts, blocking=blocking
        )

    if view.target.dialect == "stale":
        reason = "KV usage was reported during the window but no engine metrics exist now (target gone or no longer scraped)"
        return blind(reason, ("kv_usage",))
    for sig in REQUIRED_SIGNALS:
        if sig not in sourced:
            return blind(f"{sig.value} is not exported", (sig.value,))
    if not view.stat(Signal.KV_USAGE.value, p.fresh_s, "count"):
        return blind("no kv_usage samples in the last 5 minutes (stale or gone target)", ("kv_usage",))
    coverage = view.stat(Signal.KV_USAGE.value, p.window_s, "coverage") or 0.0
    found: list[Diagnosis] = []
    checks: list[RuleCheck] = []
    for rule in rules.rules:
        ev = _Eval(view, rule, facts, explain)
        result = ev.node(rule.when)
        verdict = Verdict.UNDECIDABLE if result is None else Verdict.MATCHED if result else Verdict.NOT_MATCHED
        checks.append(
            RuleCheck(rule.id, rule.mode, rule.cause, verdict, tuple(sorted({i for u in ev.unknown for i in _signal_inputs(u)})),
                      result is None and ev.points, tuple(ev.conditions), tuple(ev.parts))
        )
        if not result:
            continue
        span = min(rule.for_, p.window_s)
        ctx = _Context(view, span, facts)
        found.append(
            Diagnosis(
                mode=rule.mode,
                rule_id=rule.id,
                severity=rule.severity,
                confidence=_confidence(ev, coverage),
                summary=render(rule.summary, ctx),
                evidence=tuple(ev.evidence),
                triage=tuple(render(t, ctx) for t in rule.triage),
                cause=rule.cause,
                for_s=rule.for_,
            )
        )
    found.sort(key=lambda d: d.mode.rank)
    modes = mode_verdicts(checks)
    queue_span = min(PERSISTENT_QUEUE_SPAN_S, p.window_s)
    decision = decide(modes, view.stat("waiting", queue_span, "frac_above", 0.5))
    blocking = decision.blocking
    if decision.state is FailureMode.UNKNOWN:
        structural = all(s not in sourced for s in blocking if s in Signal._value2member_map_)
        found.insert(0, _undecided(view, decision, structural))
    elif decision.state is FailureMode.HEALTHY:
        found.append(_healthy(view))
    blind_rules = [f"rule {c.rule_id} undecidable ({', '.join(c.unknown)})" for c in checks if c.verdict is Verdict.UNDECIDABLE]
    return TargetResult(
        view.target, decision.state, tuple(found), tuple(missing + blind_rules), facts,
        modes=modes, blocking=blocking, checks=tuple(checks),
    )


def diagnose(
    targets: Iterable[Target], data: FleetData, rules: RuleSet, params: Params,
    explain: frozenset[TargetKey] = frozenset(),
) -> tuple[TargetResult, ...]:
    """Classify every target; results are sorted by (state precedence, job, instance).

    Targets in ``explain`` get every condition of every rule recorded (``kvwatch explain``)."""
    targets = list(targets)
    fleet = FleetStats([t.key for t in targets], data, params.at)
    views = [TargetView(t, data, params, fleet) for t in targets]
    groups = _group_facts(views)
    results = [diagnose_target(v, rules, groups.get(v.key, {}), v.key in explain) for v in views]
    results.sort(key=lambda r: (r.state.rank, r.target.key.job, r.target.key.instance))
    return tuple(results)
