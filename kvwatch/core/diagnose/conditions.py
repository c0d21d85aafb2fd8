"""The three-valued condition evaluator: one rule's condition tree for one target.

A statistic that cannot be computed (signal not exported, no samples) is
*unknown*, never 0; ``all`` and ``any`` short-circuit on a deciding child
whatever unknown siblings would say, and a rule matches only when its condition
is definitely true. Evidence, margins and (for ``kvwatch explain``) every
condition are collected on the way.

This per-target walk is the definition; :mod:`.fleetrules` evaluates the same conditions
for the whole fleet at once (what ``diagnose`` uses) and must give identical results
(``tests/test_diagnose_fast.py``): change both together.
"""

from __future__ import annotations

import functools
import math
import operator

from kvwatch.core.diagnose.view import TargetView
from kvwatch.core.models import Condition, Evidence
from kvwatch.core.rules import Group, Leaf, Rule

_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne}
_ORDERING = frozenset({">", ">=", "<", "<="})
_NEGATE = {">": "<=", ">=": "<", "<": ">=", "<=": ">", "==": "!=", "!=": "=="}


#: latency signals: with no request finished in the span they have no samples, and a
#: "latency is high" condition is then decided false (nobody waited), not undecidable
LATENCY_SIGNALS = frozenset(
    {"ttft_p50", "ttft_p99", "ttft_mean", "queue_p99", "queue_mean", "itl_p99", "ttft_tail_ratio", "queue_tail_share"}
)

#: derived signals that mask a signal to the samples where requests waited: their gaps (nobody
#: waiting) are an answer, so whether they are fresh is whether the signal they mask still reports
FRESH_FROM: dict[str, str] = {
    "kv_queued": "kv_usage", "running_queued": "running", "running_vs_cap_queued": "running_vs_cap"}


def leaf_span(leaf: Leaf, rule: Rule, window_s: float) -> float:
    """The span a leaf's statistic is taken over, s: the whole window or the rule's ``for`` tail."""
    return window_s if leaf.over == "window" else min(rule.for_, window_s)


class RuleEval:
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
        return leaf_span(leaf, self.rule, self.view.p.window_s)

    def _silent(self, signal: str, span: float) -> bool:
        """True when ``signal`` has samples in the span but none in the last ``fresh_s``: older
        samples cannot speak for now (an estimate that stops while nothing finishes, a series
        that vanished). Latency signals are exempt: no request finished is itself an answer."""
        if signal in LATENCY_SIGNALS or span <= self.view.p.fresh_s:
            return False
        return not self.view.stat(FRESH_FROM.get(signal, signal), self.view.p.fresh_s, "count")

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
            name, window = leaf.signal, fmt_span(span)
            stat = leaf.stat if leaf.arg is None else f"{leaf.stat}({leaf.arg:g})"
        silent = obs is not None and leaf.signal is not None and self._silent(leaf.signal, span)
        if silent:
            obs = None
        if obs is None or thr is None or not math.isfinite(obs):
            note = f"no sample in the last {fmt_span(self.view.p.fresh_s)}" if silent else ""
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
        bound = self.view.bound(name, span, leaf.stat, leaf.arg, obs) if leaf.signal is not None else ""
        if bound == "?":
            self.unknown.add(name)
            self._record(path, name, stat, window, leaf, thr, obs, None, negated, "beyond the last histogram bucket")
            return None
        inside = self.view.bucket(name, leaf.stat, obs, thr) if leaf.signal is not None and leaf.op in _ORDERING else None
        if inside is not None:
            # an interpolated quantile in the threshold's own bucket: the true value may be on
            # either side, so the comparison is not established and never counts as evidence
            # for a mode (False, or True under `not`). Not undecidable: the signal is there and
            # its resolution cannot show more; `unknown` would page healthy pools whose p99
            # sits in the SLO's bucket (a healthy trtllm-serve control: 87 of 141 steps)
            result = leaf.straddled_result(negated)
            note = (f"in the histogram bucket ({inside[0]:g}, {inside[1]:g}] that holds the threshold: "
                    + ("counts as met (straddled: true)" if leaf.straddled == "true" else "not established"))
            self._record(path, name, stat, window, leaf, thr, obs, result, negated, note)
            return result
        ok = bool(_OPS[leaf.op](obs, thr))
        if bound == ">" and not _holds_for_lower_bound(leaf.op, ok):
            # the true value is ≥ obs: "obs > thr" stays true, "obs < thr" becomes unknowable
            self.unknown.add(name)
            self._record(path, name, stat, window, leaf, thr, obs, None, negated, "lower bound", ">")
            return None
        # under `not`, a leaf that fails is what supports the diagnosis
        supports = ok != negated
        op = leaf.op if not negated else _NEGATE[leaf.op]
        self.evidence.append(Evidence(name, stat, obs, op, thr, window, supports, bound == ">"))
        if supports:
            self.margins.append(margin(obs, thr))
            if not negated and not leaf.guard:
                self.points = True
        self._record(path, name, stat, window, leaf, thr, obs, ok, negated, "lower bound" if bound else "", bound)
        return ok

    def _record(
        self, path: str, name: str, stat: str, window: str, leaf: Leaf, thr: float | None,
        obs: float | None, met: bool | None, negated: bool, note: str, bound: str = "",
    ) -> None:
        if self.explain:
            self.conditions.append(
                Condition(path, name, stat, window, leaf.op, thr, obs, met, leaf.guard, negated, bound, note)
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
        saved: tuple[int, int, set[str], bool] | None = None
        for i, child in enumerate(n.all or n.any or ()):
            r = self.node(child, negated, f"{path}.{kind}[{i}]")
            if path == "when":
                self.parts.append(r)
            if r is decisive and saved is None:
                if not self.explain:
                    return decisive
                # explain goes on to record the siblings a short circuit skips; what they find
                # is no evidence (the verdict never reads them), so it is rolled back after
                saved = (len(self.evidence), len(self.margins), set(self.unknown), self.points)
            unknown = unknown or r is None
        if saved is not None:
            del self.evidence[saved[0]:], self.margins[saved[1]:]
            self.unknown, self.points = saved[2], saved[3]
            return decisive
        return None if unknown else not decisive


def margin(obs: float, thr: float) -> float:
    """How clearly a supporting comparison is met, 0..1: the distance to the threshold
    relative to the threshold (at least 0.05, so thresholds near 0 do not blow it up)."""
    return min(1.0, abs(obs - thr) / max(abs(thr), 0.05))


def _holds_for_lower_bound(op: str, ok: bool) -> bool:
    """Whether a comparison decided on a lower bound of the observed value stays decided."""
    if op in (">", ">="):
        return ok  # true stays true (the value is even larger); false is unknowable
    if op in ("<", "<="):
        return not ok  # false stays false; true is unknowable
    return False


@functools.lru_cache(maxsize=64)
def fmt_span(seconds: float) -> str:
    return f"{seconds / 60:g}m" if seconds >= 60 else f"{seconds:g}s"
