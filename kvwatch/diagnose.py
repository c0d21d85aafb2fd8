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
    Diagnosis,
    Evidence,
    FailureMode,
    Severity,
    Target,
    TargetKey,
    TargetResult,
)
from kvwatch.render_template import Num, render
from kvwatch.ruleset import SIGNAL_NAMES, Group, Leaf, Rule, RuleSet
from kvwatch.signals import REQUIRED_SIGNALS, Signal

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


class _Eval:
    """Evaluates one rule's condition tree for one target, collecting evidence."""

    def __init__(self, view: TargetView, rule: Rule, facts: dict[str, float | None]) -> None:
        self.view, self.rule, self.facts = view, rule, facts
        self.evidence: list[Evidence] = []
        self.margins: list[float] = []
        self.unknown: set[str] = set()

    def span(self, leaf: Leaf) -> float:
        return self.view.p.window_s if leaf.over == "window" else min(self.rule.for_, self.view.p.window_s)

    def leaf(self, leaf: Leaf, negated: bool = False) -> bool | None:
        thr = leaf.threshold(self.facts)
        if leaf.fact is not None:
            obs, name, stat, window = self.facts.get(leaf.fact), leaf.fact, "value", "now"
        else:
            assert leaf.signal is not None
            span = self.span(leaf)
            obs = self.view.stat(leaf.signal, span, leaf.stat, leaf.arg)
            name, window = leaf.signal, _fmt_span(span)
            stat = leaf.stat if leaf.arg is None else f"{leaf.stat}({leaf.arg:g})"
        if obs is None or thr is None or not math.isfinite(obs):
            if leaf.missing != "unknown":
                return leaf.missing == "true"
            self.unknown.add(name)
            return None
        ok = bool(_OPS[leaf.op](obs, thr))
        # under `not`, a leaf that fails is what supports the diagnosis
        supports = ok != negated
        op = leaf.op if not negated else _NEGATE[leaf.op]
        self.evidence.append(Evidence(name, stat, obs, op, thr, window, supports))
        if supports:
            self.margins.append(min(1.0, abs(obs - thr) / max(abs(thr), 0.05)))
        return ok

    def node(self, n: Group | Leaf, negated: bool = False) -> bool | None:
        if isinstance(n, Leaf):
            return self.leaf(n, negated)
        if n.not_ is not None:
            r = self.node(n.not_, not negated)
            return None if r is None else not r
        # short-circuit: a False child decides `all`, a True child decides `any`,
        # whatever the unknown siblings would say (three-valued logic)
        decisive = n.all is None
        unknown = False
        for child in n.all or n.any or ():
            r = self.node(child, negated)
            if r is decisive:
                return decisive
            unknown = unknown or r is None
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


def _unknown(view: TargetView, reason: str) -> Diagnosis:
    return Diagnosis(
        mode=FailureMode.UNKNOWN,
        rule_id="blind-spot",
        severity=Severity.WARNING,
        confidence=1.0,
        summary=f"Blind spot: {reason}; kvwatch cannot tell this target's state.",
        evidence=(),
        triage=(
            f"Check that {view.target.instance_hint()} is scraped and exports KV-cache metrics "
            "(vLLM: vllm:kv_cache_usage_perc; SGLang: --enable-metrics; TensorRT-LLM: enable_iter_perf_stats).",
            "Check the discovery selector and that the engine version's metric names are supported (kvwatch check).",
        ),
    )


def diagnose_target(
    view: TargetView, rules: RuleSet, group: dict[str, float | None]
) -> TargetResult:
    """Classify one target. ``group`` holds replica facts computed across the fleet."""
    p = view.p
    sourced = view.data.sourced.get(view.key, set())
    missing: list[str] = []
    for sig in _ALL_SIGNALS:
        if sig not in sourced:
            missing.append(sig.value)
        elif not view.stat(sig.value, p.window_s, "count"):
            missing.append(f"{sig.value} (no data)")
    facts = facts_for(view, group)
    if view.target.dialect == "stale":
        reason = "KV usage was reported during the window but no engine metrics exist now (target gone or no longer scraped)"
        return TargetResult(view.target, FailureMode.UNKNOWN, (_unknown(view, reason),), tuple(missing), facts)
    for sig in REQUIRED_SIGNALS:
        if sig not in sourced:
            return TargetResult(
                view.target, FailureMode.UNKNOWN, (_unknown(view, f"{sig.value} is not exported"),), tuple(missing), facts
            )
    if not view.stat(Signal.KV_USAGE.value, p.fresh_s, "count"):
        reason = "no kv_usage samples in the last 5 minutes (stale or gone target)"
        return TargetResult(view.target, FailureMode.UNKNOWN, (_unknown(view, reason),), tuple(missing), facts)
    coverage = view.stat(Signal.KV_USAGE.value, p.window_s, "coverage") or 0.0
    found: list[Diagnosis] = []
    blind: list[str] = []
    for rule in rules.rules:
        ev = _Eval(view, rule, facts)
        result = ev.node(rule.when)
        if result is None:
            blind.append(f"{rule.id} undecidable ({', '.join(sorted(ev.unknown))})")
            continue
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
    state = found[0].mode if found else FailureMode.HEALTHY
    if not found:
        found.append(_healthy(view))
    return TargetResult(view.target, state, tuple(found), tuple(missing + [f"rule {b}" for b in blind]), facts)


def diagnose(targets: Iterable[Target], data: FleetData, rules: RuleSet, params: Params) -> tuple[TargetResult, ...]:
    """Classify every target; results are sorted by (state precedence, job, instance)."""
    targets = list(targets)
    fleet = FleetStats([t.key for t in targets], data, params.at)
    views = [TargetView(t, data, params, fleet) for t in targets]
    groups = _group_facts(views)
    results = [diagnose_target(v, rules, groups.get(v.key, {})) for v in views]
    results.sort(key=lambda r: (r.state.rank, r.target.key.job, r.target.key.instance))
    return tuple(results)
