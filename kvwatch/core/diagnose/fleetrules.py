"""Rule conditions for the whole fleet at once: the fast path of :mod:`.conditions`.

:class:`~.conditions.RuleEval` walks one rule's tree for one target, which costs a few
microseconds of Python per leaf and target (most of a 1,000-target diagnosis). Here each
leaf is evaluated for every target as numpy vectors — observed value, freshness,
missing-data policy, histogram lower bounds and straddled buckets, the comparison — and
the ``all``/``any``/``not`` tree is combined in three-valued vector logic, with the
short-circuit as a *visited* mask so that exactly the leaves the per-target walk reaches
contribute unknown signals, ``points`` and the top-level ``parts``.

Everything a rule check and a matched rule's diagnosis need comes from here: the result,
the unknown signals, ``points``, ``parts``, and for a matched rule its evidence and margins
(built only for the targets it matched). ``kvwatch explain`` and ``diagnose(...,
reference=True)`` use the per-target walk, which stays the definition of the semantics.
The two must agree exactly: ``tests/test_diagnose_fast.py`` diagnoses varied fleets both
ways and compares every result (``KVWATCH_CHECK_FLEET_RULES=1`` makes any test run compare
every rule of every target too); a change to :meth:`RuleEval.leaf <.conditions.RuleEval.leaf>`
or :meth:`RuleEval.node <.conditions.RuleEval.node>` needs the same change in
:meth:`FleetRules._leaf` / :meth:`FleetRules._node`.

Per-target work that stays per target, because it is rare or a walk along one series:
statistics without a fleet kernel (swings, episodes; only for targets that reach the leaf),
and the histogram bound of a statistic whose span holds a sample at the bucket ceiling
(:meth:`TargetView.bound <.view.TargetView.bound>`, the reference, decides those).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvwatch.core.bounds import ORDER_STATS
from kvwatch.core.diagnose.conditions import (
    _NEGATE,
    _OPS,
    _ORDERING,
    FRESH_FROM,
    LATENCY_SIGNALS,
    _holds_for_lower_bound,
    fmt_span,
    leaf_span,
    margin,
)
from kvwatch.core.diagnose.view import TargetView
from kvwatch.core.models import Evidence, RuleCheck
from kvwatch.core.rules import DERIVED_INPUTS, Group, Leaf, Rule, bucket_signal
from kvwatch.core.statistics.registry import REGISTRY

Tri = tuple[np.ndarray, np.ndarray]  # (true, false) masks; neither: unknown


@dataclass(eq=False)
class Outcome:
    """What the diagnosis reads of one rule's evaluation for one target: the attributes of
    :class:`~.conditions.RuleEval` after :meth:`~.conditions.RuleEval.node`. An outcome of a
    rule that did not match is shared by every target with the same one; ``check`` caches
    its :class:`RuleCheck` (the same for all of them)."""

    result: bool | None
    unknown: frozenset[str]
    points: bool
    parts: tuple[bool | None, ...]
    evidence: tuple[Evidence, ...] = ()
    margins: tuple[float, ...] = ()
    conditions: tuple[()] = ()
    check: RuleCheck | None = None


@dataclass(frozen=True)
class _Compared:
    """A leaf's comparison where it was decided on a number (the evidence of a matched rule)."""

    leaf: Leaf
    name: str
    stat: str
    window: str
    negated: bool
    decided: np.ndarray  # targets whose evidence holds this leaf
    obs: np.ndarray
    thr: np.ndarray
    ok: np.ndarray
    lower: np.ndarray


class _Acc:
    """Per-rule side effects of the leaves a target reaches: unknown names, points, parts."""

    def __init__(self, n: int) -> None:
        self.names: dict[str, int] = {}  # unknown name → bit
        self.unknown = np.zeros(n, dtype=np.int64)
        self.points = np.zeros(n, dtype=bool)
        self.parts: list[np.ndarray] = []  # per top-level child: 0 false, 1 true, 2 unknown, 3 not reached
        self.compared: list[_Compared] = []  # in the order the per-target walk reaches them

    def add_unknown(self, name: str, mask: np.ndarray) -> None:
        bit = self.names.setdefault(name, 1 << len(self.names))
        self.unknown |= np.where(mask, bit, 0)


class FleetRules:
    """Every rule's outcome for every target of ``views`` (facts: each target's facts)."""

    def __init__(self, views: Sequence[TargetView], facts: Sequence[dict[str, float | None]]) -> None:
        self.views = list(views)
        self.facts = list(facts)
        self.n = len(self.views)
        if self.n:
            self.fleet = self.views[0].fleet
            self.p = self.views[0].p
        self.rows = np.array([v.row for v in self.views], dtype=np.intp)
        self._facts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._obs: dict[tuple[str, float, str, float | None], np.ndarray] = {}
        self._layout: dict[str, np.ndarray] = {}
        self._outcomes: dict[tuple[object, ...], Outcome] = {}

    # ---- per-target values as fleet vectors ------------------------------------------------

    def _fact(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(values, is None) of one fact for every target; None reads as NaN in ``values``."""
        got = self._facts.get(name)
        if got is None:
            raw = [f.get(name) for f in self.facts]
            none = np.array([x is None for x in raw], dtype=bool)
            vals = np.array([math.nan if x is None else x for x in raw], dtype=float)
            got = self._facts[name] = (vals, none)
        return got

    def _stat(self, name: str, span: float, stat: str, arg: float | None, rows: np.ndarray) -> np.ndarray:
        """:meth:`TargetView.stat` for every target (NaN: None). Statistics without a fleet
        kernel are walked per series, and only for ``rows`` (the targets that reach the leaf)."""
        entry = REGISTRY.get(stat)
        if entry is None:
            raise KeyError(stat)
        if entry.fleet is not None:
            key = (name, span, stat, arg)
            got = self._obs.get(key)
            if got is None:
                vec = self.fleet.vector(name, span, stat, arg)
                got = self._obs[key] = (np.full(self.n, math.nan) if vec is None
                                        else np.asarray(vec, dtype=float)[self.rows])
            return got
        out = np.full(self.n, math.nan)
        for i in np.flatnonzero(rows):
            x = self.views[i].stat(name, span, stat, arg)
            if x is not None:
                out[i] = x
        return out

    def _count_zero(self, name: str, span: float) -> np.ndarray:
        """``not view.stat(name, span, "count")`` for every target."""
        vec = self.fleet.vector(name, span, "count")
        if vec is None:
            return np.ones(self.n, dtype=bool)
        v = np.asarray(vec, dtype=float)[self.rows]
        return ~(np.isfinite(v) & (v != 0))

    def _has_layout(self, name: str) -> np.ndarray:
        """Targets with a histogram bucket layout for signal ``name``."""
        got = self._layout.get(name)
        if got is None:
            sig = bucket_signal(name)
            rows = self.fleet.target_buckets
            got = self._layout[name] = np.array(
                [sig is not None and bool(rows[r].get(sig)) for r in self.rows.tolist()], dtype=bool)
        return got

    # ---- the condition tree ------------------------------------------------------------------

    def _leaf(self, rule: Rule, leaf: Leaf, negated: bool, vis: np.ndarray, acc: _Acc) -> Tri:
        """:meth:`RuleEval.leaf <.conditions.RuleEval.leaf>` for the targets in ``vis``."""
        n, p = self.n, self.p
        if leaf.ref is None:
            thr, thr_none = np.full(n, math.nan if leaf.value is None else leaf.value), np.zeros(n, dtype=bool)
        else:
            base, thr_none = self._fact(leaf.ref)
            thr = base * (1.0 if leaf.value is None else leaf.value)
        if leaf.fact is not None:
            obs, obs_none = self._fact(leaf.fact)
            name, span = leaf.fact, 0.0
            silent = np.zeros(n, dtype=bool)
        else:
            assert leaf.signal is not None
            name = leaf.signal
            span = leaf_span(leaf, rule, p.window_s)
            obs = self._stat(name, span, leaf.stat, leaf.arg, vis)
            obs_none = np.isnan(obs)
            if name in LATENCY_SIGNALS or span <= p.fresh_s:
                silent = np.zeros(n, dtype=bool)
            else:
                silent = ~obs_none & self._count_zero(FRESH_FROM.get(name, name), p.fresh_s)
        true, false = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        missing = vis & (obs_none | silent | thr_none | ~np.isfinite(obs))
        if missing.any():
            if leaf.missing != "unknown":
                (true if leaf.missing == "true" else false)[missing] = True
            else:
                if name in LATENCY_SIGNALS and leaf.op in (">", ">="):
                    top = self._stat("request_rate", span, "max", None, missing)
                    quiet = missing & np.isfinite(top) & (top <= 0.0)
                    false |= quiet
                    missing = missing & ~quiet
                acc.add_unknown(name, missing)
        present = vis & ~(obs_none | silent | thr_none | ~np.isfinite(obs))
        if not present.any():
            return true, false
        lower = np.zeros(n, dtype=bool)
        if leaf.signal is not None:
            # only a target with a sample at a histogram ceiling can have a bound other than ""
            check = present & self.fleet.may_clamp(DERIVED_INPUTS.get(name, (name,)), span)[self.rows]
            for i in np.flatnonzero(check):
                b = self.views[i].bound(name, span, leaf.stat, leaf.arg, float(obs[i]))
                if b == "?":
                    acc.add_unknown(name, np.arange(n) == i)
                    present[i] = False
                elif b == ">":
                    lower[i] = True
            if leaf.op in _ORDERING and leaf.stat in ORDER_STATS:
                for i in np.flatnonzero(present & self._has_layout(name)):
                    if self.views[i].bucket(name, leaf.stat, float(obs[i]), float(thr[i])) is not None:
                        # inside the threshold's bucket: not established, or met where the leaf says so
                        (true if leaf.straddled_result(negated) else false)[i] = True
                        present[i] = False
        with np.errstate(invalid="ignore"):
            ok = np.asarray(_OPS[leaf.op](obs, thr), dtype=bool)
        holds = np.where(ok, _holds_for_lower_bound(leaf.op, True), _holds_for_lower_bound(leaf.op, False))
        undecided = present & lower & ~holds
        if undecided.any():
            acc.add_unknown(name, undecided)
            present &= ~undecided
        true |= present & ok
        false |= present & ~ok
        if not negated and not leaf.guard:
            acc.points |= present & ok
        if present.any():
            stat = "value" if leaf.fact is not None else leaf.stat if leaf.arg is None else f"{leaf.stat}({leaf.arg:g})"
            window = "now" if leaf.fact is not None else fmt_span(span)
            acc.compared.append(_Compared(leaf, name, stat, window, negated, present, obs, thr, ok, lower))
        return true, false

    def _node(self, rule: Rule, node: Group | Leaf, negated: bool, vis: np.ndarray, acc: _Acc, top: bool) -> Tri:
        """:meth:`RuleEval.node <.conditions.RuleEval.node>` for the targets in ``vis``: a
        child is reached while no earlier sibling decided the group (the short-circuit)."""
        if isinstance(node, Leaf):
            return self._leaf(rule, node, negated, vis, acc)
        if node.not_ is not None:
            t, f = self._node(rule, node.not_, not negated, vis, acc, False)
            return f, t
        any_ = node.all is None
        decided = np.zeros(self.n, dtype=bool)
        unknown = np.zeros(self.n, dtype=bool)
        for child in node.all or node.any or ():
            reach = vis & ~decided
            t, f = self._node(rule, child, negated, reach, acc, False)
            if top:
                acc.parts.append(np.where(~reach, 3, np.where(t, 1, np.where(f, 0, 2))))
            decided |= reach & (t if any_ else f)
            unknown |= reach & ~t & ~f
        rest = vis & ~decided & ~unknown
        return (decided, rest) if any_ else (rest, decided)

    def evaluate(self, rules: Sequence[Rule]) -> list[list[Outcome]]:
        """Per rule, per target (in ``views`` order): the :class:`Outcome`."""
        out: list[list[Outcome]] = []
        if not self.n:
            return [[] for _ in rules]
        everyone = np.ones(self.n, dtype=bool)
        for rule in rules:
            acc = _Acc(self.n)
            t, f = self._node(rule, rule.when, False, everyone, acc, True)
            result = np.where(t, 1, np.where(f, 0, 2))
            parts = np.zeros(self.n, dtype=np.int64)
            for j, code in enumerate(acc.parts):
                parts += code.astype(np.int64) << (2 * j)
            names = [(bit, name) for name, bit in acc.names.items()]
            keys = zip(result.tolist(), acc.unknown.tolist(), acc.points.tolist(), parts.tolist(), strict=True)
            row: list[Outcome] = []
            for i, key in enumerate(keys):
                if key[0] == 1:  # matched: the rule's diagnosis quotes its evidence
                    row.append(_outcome(key, names, len(acc.parts), *self._evidence(acc.compared, i)))
                    continue
                o = self._outcomes.get((rule.id, *key))
                if o is None:
                    o = self._outcomes[(rule.id, *key)] = _outcome(key, names, len(acc.parts))
                row.append(o)
            out.append(row)
        return out

    def _evidence(self, compared: list[_Compared], i: int) -> tuple[tuple[Evidence, ...], tuple[float, ...]]:
        """Target ``i``'s evidence and margins, as :meth:`RuleEval.leaf <.conditions.RuleEval.leaf>`
        appends them: every leaf it reached that compared two numbers, in walk order."""
        evidence: list[Evidence] = []
        margins: list[float] = []
        for c in compared:
            if not c.decided[i]:
                continue
            leaf = c.leaf
            # the fact itself (its Python type, as the per-target walk reads it), else the statistic
            obs = self.facts[i].get(leaf.fact) if leaf.fact is not None else float(c.obs[i])
            thr = leaf.threshold(self.facts[i])
            assert obs is not None and thr is not None
            ok = bool(c.ok[i])
            supports = ok != c.negated
            op = leaf.op if not c.negated else _NEGATE[leaf.op]
            evidence.append(Evidence(c.name, c.stat, obs, op, thr, c.window, supports, bool(c.lower[i])))
            if supports:
                margins.append(margin(obs, thr))
        return tuple(evidence), tuple(margins)


_RESULT: tuple[bool | None, ...] = (False, True, None, None)


def _outcome(key: tuple[int, int, bool, int], names: list[tuple[int, str]], nparts: int,
             evidence: tuple[Evidence, ...] = (), margins: tuple[float, ...] = ()) -> Outcome:
    result, unknown, points, code = key
    parts: list[bool | None] = []
    for j in range(nparts):
        c = (code >> (2 * j)) & 3
        if c == 3:
            break
        parts.append(_RESULT[c])
    return Outcome(_RESULT[result], frozenset(n for bit, n in names if unknown & bit), points, tuple(parts),
                   evidence, margins)
