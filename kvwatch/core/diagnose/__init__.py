"""The pure diagnosis core: (fleet data, rules) → one result per target.

No network, clock or Slack here: everything arrives as arguments, so this package
is tested with plain arrays. One module per job:

- :mod:`.prefill`: the admission queue behind a waiting gauge that also counts requests in prefill;
- :mod:`.view`: :class:`Params` and the per-target data view over the fleet statistics cache;
- :mod:`.facts`: capacity facts (tokens, headroom, period) of one target;
- :mod:`.groups`: replica-group facts across targets of one (job, model);
- :mod:`.conditions`: the three-valued evaluator of one rule's condition tree (the definition);
- :mod:`.fleetrules`: the same conditions for every target at once, as numpy vectors (the fast path);
- :mod:`.context`: the template context of triage text;
- :mod:`.verdicts`: rule outcomes → one verdict per mode → the target state (precedence);
- :mod:`.target`: one target's result: blind spots, rule checks, diagnoses, confidence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Set
from concurrent.futures import ThreadPoolExecutor

from kvwatch.core.diagnose.facts import facts_for
from kvwatch.core.diagnose.fleetrules import FleetRules, Outcome
from kvwatch.core.diagnose.groups import GROUP_SPAN_S, group_facts
from kvwatch.core.diagnose.prefill import admission_queue
from kvwatch.core.diagnose.target import diagnose_target, gone_reason
from kvwatch.core.diagnose.view import Params, TargetView, fleet_stats
from kvwatch.core.frame import FleetData
from kvwatch.core.models import Target, TargetKey, TargetResult, Verdict
from kvwatch.core.rules import RuleSet
from kvwatch.core.signals import Signal

__all__ = ["GROUP_SPAN_S", "Params", "TargetView", "diagnose", "diagnose_target", "facts_for", "with_rows"]

#: fetches the triage-only signals of these targets: a FleetData on the same grid
TriageFetch = Callable[[list[TargetKey]], FleetData]


def diagnose(
    targets: Iterable[Target], data: FleetData, rules: RuleSet, params: Params,
    explain: frozenset[TargetKey] = frozenset(), reference: bool = False, triage: TriageFetch | None = None,
) -> tuple[TargetResult, ...]:
    """Classify every target; results are sorted by (state precedence, job, instance).

    Targets in ``explain`` get every condition of every rule recorded (``kvwatch explain``),
    by the per-target evaluator. The others' rule conditions are evaluated for the whole
    fleet at once (:mod:`.fleetrules`); ``reference`` evaluates them per target instead
    (the definition the fast path is tested against: the results are identical).

    ``triage``: ``data`` lacks the signals only matched rules' text reads
    (``rules.triage_signals()``); they are fetched through it for the targets with a matched
    rule that export one (one call, on a worker thread while the other targets are diagnosed),
    and those targets' text and blind spots are made with them. The results are exactly those of one pass over data that hold every signal:
    no rule condition, fact or state reads them (so the rule outcomes and facts of the first
    pass stand), and a target without a matched rule does not list them as blind spots.
    """
    targets = list(targets)
    data = admission_queue(data, targets, params.ttft_slo_s)
    only_triage = rules.triage_signals()
    fleet = fleet_stats([t.key for t in targets], data, params)
    views = [TargetView(t, data, params, fleet) for t in targets]
    groups = group_facts(views)
    facts = [facts_for(v, groups.get(v.key, {})) for v in views]
    per_rule = [] if reference else FleetRules(views, facts).evaluate(rules.rules)

    def outcomes(j: int, key: TargetKey) -> list[Outcome] | None:
        return None if reference or key in explain else [o[j] for o in per_rule]

    # with a second pass to come, targets that export a triage-only signal get no text now
    later = set() if triage is None or not only_triage else {
        t.key for t in targets if only_triage & data.sourced.get(t.key, set())}
    results: list[TargetResult | None] = [None] * len(targets)

    def first_pass(j: int) -> None:
        v = views[j]
        results[j] = diagnose_target(v, rules, groups.get(v.key, {}), v.key in explain, facts[j],
                                     outcomes(j, v.key), only_triage, draft=v.key in later)

    # The targets with a matched rule need the triage rows for their text. Those the fleet-wide
    # outcomes show are not drafted: the fetch starts at once and runs (Prometheus' CPU, socket
    # waits) while the other targets are diagnosed, and they are diagnosed once, after it. A
    # match that the samples do not cover yet is fetched too (it turns undecided; one more row
    # read, the same result). Explained (or reference) targets have no fleet-wide outcomes:
    # their draft, made first, says whether they matched.
    for j, t in enumerate(targets):
        if t.key in later and outcomes(j, t.key) is None:
            first_pass(j)

    def matched(j: int) -> bool:
        r = results[j]
        if r is not None:  # drafted: its own checks
            return any(c.verdict is Verdict.MATCHED for c in r.checks)
        # a gone or stale target shows no rule whatever its outcomes
        return any(o[j].result for o in per_rule) and not gone_reason(views[j])

    pending = [j for j, t in enumerate(targets) if t.key in later and matched(j)]
    again = set(pending)
    keys = [targets[j].key for j in pending]
    with ThreadPoolExecutor(max_workers=1) as pool:
        fetched = pool.submit(triage, keys) if triage is not None and keys else None
        for j in range(len(targets)):
            if results[j] is None and j not in again:
                first_pass(j)
        extra = fetched.result() if fetched is not None else None
    if extra is not None:
        full = with_rows(data, extra, keys, only_triage)
        fleet2 = fleet_stats(keys, full, params)
        for j in pending:
            view = TargetView(targets[j], full, params, fleet2)
            # the same rule outcomes, facts and replica-group facts: none reads a triage signal
            results[j] = diagnose_target(view, rules, groups.get(view.key, {}), view.key in explain, facts[j],
                                         outcomes(j, view.key), only_triage)
    done = [r for r in results if r is not None]
    assert len(done) == len(targets)
    done.sort(key=lambda r: (r.state.rank, r.target.key.job, r.target.key.instance))
    return tuple(done)


def with_rows(data: FleetData, extra: FleetData, keys: Iterable[TargetKey], signals: Set[Signal]) -> FleetData:
    """``data`` with ``extra``'s rows of ``signals`` added for ``keys`` (a shallow copy: ``data``
    itself, which the service keeps between cycles, is not changed). Same grid required."""
    if len(extra.grid) != len(data.grid) or not (len(data.grid) == 0 or extra.grid[-1] == data.grid[-1]):
        raise ValueError("triage rows are on another grid than the data")
    series = dict(data.series)
    for key in keys:
        add = {s: v for s, v in extra.series.get(key, {}).items() if s in signals}
        if add:
            series[key] = {**series.get(key, {}), **add}
    return dataclasses.replace(data, series=series)
