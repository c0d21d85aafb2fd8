"""The pure diagnosis core: (fleet data, rules) → one result per target.

No network, clock or Slack here: everything arrives as arguments, so this package
is tested with plain arrays. One module per job:

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

from collections.abc import Iterable

from kvwatch.core.diagnose.facts import facts_for
from kvwatch.core.diagnose.fleetrules import FleetRules
from kvwatch.core.diagnose.groups import GROUP_SPAN_S, group_facts
from kvwatch.core.diagnose.target import diagnose_target
from kvwatch.core.diagnose.view import Params, TargetView
from kvwatch.core.frame import FleetData
from kvwatch.core.models import Target, TargetKey, TargetResult
from kvwatch.core.rules import RuleSet
from kvwatch.core.statistics.fleet import FleetStats

__all__ = ["GROUP_SPAN_S", "Params", "TargetView", "diagnose", "diagnose_target", "facts_for"]


def diagnose(
    targets: Iterable[Target], data: FleetData, rules: RuleSet, params: Params,
    explain: frozenset[TargetKey] = frozenset(), reference: bool = False,
) -> tuple[TargetResult, ...]:
    """Classify every target; results are sorted by (state precedence, job, instance).

    Targets in ``explain`` get every condition of every rule recorded (``kvwatch explain``),
    by the per-target evaluator. The others' rule conditions are evaluated for the whole
    fleet at once (:mod:`.fleetrules`); ``reference`` evaluates them per target instead
    (the definition the fast path is tested against: the results are identical)."""
    targets = list(targets)
    fleet = FleetStats([t.key for t in targets], data, params.at)
    views = [TargetView(t, data, params, fleet) for t in targets]
    groups = group_facts(views)
    facts = [facts_for(v, groups.get(v.key, {})) for v in views]
    per_rule = [] if reference else FleetRules(views, facts).evaluate(rules.rules)
    results = [
        diagnose_target(v, rules, groups.get(v.key, {}), v.key in explain, facts[j],
                        None if reference or v.key in explain else [o[j] for o in per_rule])
        for j, v in enumerate(views)
    ]
    results.sort(key=lambda r: (r.state.rank, r.target.key.job, r.target.key.instance))
    return tuple(results)
