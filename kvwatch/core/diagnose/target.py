"""The verdict for one target: blind spots, rule checks, matched diagnoses, the state.

A target whose required signals are missing or stale is ``unknown`` (a blind
spot, never healthy); otherwise every rule is evaluated three-valued, the rule
outcomes become one verdict per mode and :func:`~.verdicts.decide` picks the
state by failure-mode precedence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence, Set

import numpy as np

from kvwatch.core.diagnose.conditions import RuleEval
from kvwatch.core.diagnose.context import TemplateContext
from kvwatch.core.diagnose.facts import facts_for
from kvwatch.core.diagnose.fleetrules import Outcome
from kvwatch.core.diagnose.verdicts import (
    PERSISTENT_QUEUE_SPAN_S,
    QUEUE_CLEARED_S,
    StateDecision,
    decide,
    mode_verdicts,
)
from kvwatch.core.diagnose.view import TargetView
from kvwatch.core.dialects import DIALECT_BY_ID, kv_proxy, waiting_is_estimate, waiting_shows_stalls
from kvwatch.core.models import (
    Condition,
    Diagnosis,
    FailureMode,
    RuleCheck,
    Severity,
    TargetResult,
    Verdict,
)
from kvwatch.core.rules import DERIVED_INPUTS, Rule, RuleSet
from kvwatch.core.signals import ONLY_WITHOUT, REQUIRED_SIGNALS, Signal
from kvwatch.core.templates import Num, render

# iterating an Enum class, and reading a member's value, are slow
_ALL_SIGNALS: tuple[tuple[Signal, str], ...] = tuple((s, s.value) for s in Signal)


def _confidence(ev: RuleEval | Outcome, coverage: float) -> float:
    base = 0.5 + 0.5 * (sum(ev.margins) / len(ev.margins) if ev.margins else 0.0)
    return round(max(0.05, min(1.0, base * (0.5 + 0.5 * coverage))), 3)


def _queue_phrase(view: TargetView, span_s: float) -> str:
    """The queue as a reader of a healthy verdict needs it: none, a brief one now, or one that
    ended (how long ago, how large). The window's mean would print a queue that drained
    minutes ago as if requests were waiting now. Empty without a queue gauge."""
    top = view.stat("waiting", span_s, "max")
    if top is None:
        return ""
    if top < 0.5:
        return f", no queue in {span_s / 60:g} min"
    last = view.stat("waiting", span_s, "last")
    if last is not None and last >= 0.5:
        return f", {last:,.0f} waiting now (not a persistent queue)"
    since = view.stat("waiting", span_s, "since_above", 0.5)
    ago = f" for the last {since / 60:.1f} min" if since is not None else ""
    return f", no queue{ago} (up to {top:,.0f} waited earlier in the window)"


def _healthy(view: TargetView) -> Diagnosis:
    w = view.p.window_s
    usage = Num(view.stat("kv_usage", w, "mean"))
    p90 = Num(view.stat("kv_usage", w, "p90"))
    return Diagnosis(
        mode=FailureMode.HEALTHY,
        rule_id="healthy",
        severity=Severity.INFO,
        confidence=0.9,
        summary=f"KV {usage:.0%} used on average (p90 {p90:.0%}){_queue_phrase(view, w)}, no failure-mode signature.",
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


def _gap_as_before(view: TargetView, span_s: float) -> bool:
    """Whether the queue's current empty stretch is no longer than a gap it already made and
    refilled within the last ``span_s`` seconds (an intermittent queue, e.g. a reservation
    releasing blocks now and then): then it is one more gap, not a recovery. Read over the
    whole window, not the persistent-queue span: a queue near its service rate empties for
    minutes at random, and the earlier gap that shows this may lie 20 minutes back."""
    st = view.stats("waiting", span_s)
    if st is None or not len(st.v):
        return False
    queued = np.flatnonzero(st.v >= 0.5)  # finite samples only: a scrape gap is neither queue nor drain
    if not len(queued):
        return False
    trailing = len(st.v) - 1 - int(queued[-1])
    longest = int(np.diff(queued).max()) - 1 if len(queued) > 1 else 0  # empty samples between two queued ones
    return 0 < trailing <= longest


#: seconds of queue per request (the queue-time mean) from which requests the queue gauge does
#: not show count as queued: the same second the full and oscillating rules read where no gauge
#: saw a queue (``no_gauge_queue``)
HIDDEN_QUEUE_WAIT_S = 1.0
#: queue-time mean (s) at the newest reading under which the requests finishing now did not
#: queue: the half second oscillating's recency reads in the same mean
HIDDEN_QUEUE_CLEARED_S = 0.5
#: share of its peak over the span the newest queue-time mean must still hold to count where an
#: executor-only gauge saw a queue: the mean of a recovered episode decays as the requests that
#: queued finish out of its window (and the gauge saw that queue end); a stall holds it level
HIDDEN_QUEUE_HELD = 0.8


def _hidden_queue_frac(view: TargetView, span_s: float) -> float | None:
    """Share of the last ``span_s`` seconds in which requests queued by their own account where
    the queue gauge does not show them: the queue-time mean ≥ 1 s and, by Little's law, at
    least one request waiting on average (mean × finished requests/s ≥ 1). The gauge misses
    them where it showed no queue in the whole window, or where it counts the executor's queue
    only and so is blind to the queue in front of it (trtllm-serve without its running gauge
    reads only ``trtllm_num_requests_waiting``); where that gauge did see a queue, the mean
    counts only while it holds :data:`HIDDEN_QUEUE_HELD` of its peak. Each reading averages
    the span before it (10 minutes for a histogram mean), so the readings of the last
    ``span_s`` still carry a queue that ended before it: the queue is over (0) when the newest
    reading, the requests that finished last, waited under :data:`HIDDEN_QUEUE_CLEARED_S` on
    average, as a gauge's queue is when it read empty twice. None where a gauge that counts
    the whole queue saw one (it is then read as is), where the queue is the Little's-law
    estimate (already this account), or without a queue-time mean and a request rate."""
    if waiting_is_estimate(view.target):
        return None
    gauge_saw = (view.stat("waiting", view.p.window_s, "max") or 0.0) >= 0.5
    if gauge_saw and waiting_shows_stalls(view.target):
        return None
    qm, rr = view.raw("queue_mean"), view.raw("request_rate")
    if qm is None or rr is None:
        return None
    i0 = view.fleet.start(span_s)
    q, r = qm[i0:], rr[i0:]
    ok = np.isfinite(q) & np.isfinite(r)
    if not ok.any():
        return None
    newest = q[ok][-1]
    if newest < HIDDEN_QUEUE_CLEARED_S or (gauge_saw and newest < HIDDEN_QUEUE_HELD * float(q[ok].max())):
        return 0.0
    hit = ok & (q >= HIDDEN_QUEUE_WAIT_S) & (q * r >= 1.0)
    return float(np.count_nonzero(hit) / np.count_nonzero(ok))


def _slow_first_token(view: TargetView, span: float) -> str:
    """Why the typical request is slow where nothing queues ("" when it is not, or cannot be told).

    The TTFT median over the last ``span`` seconds (the persistent-queue net's recent span) and
    its newest reading both at or over the SLO,
    established by the histogram (a median in the SLO's own bucket is not), with nobody waiting
    and nothing preempted over the whole window: the 10-minute quantiles of a recovered episode
    carry its queue's wait, which is that episode's after-effect, not the pool's latency.
    """
    p = view.p
    med = view.stat("ttft_p50", span, "median")
    last = view.stat("ttft_p50", span, "last")
    if med is None or last is None or min(med, last) < p.ttft_slo_s:
        return ""
    if view.bucket("ttft_p50", "median", med, p.ttft_slo_s) or view.bucket("ttft_p50", "last", last, p.ttft_slo_s):
        return ""
    if (view.stat("waiting", p.window_s, "max") or 0.0) >= 1 or (view.stat("preemptions", p.window_s, "max") or 0.0) > 0:
        return ""
    return (f"the typical request waits {med:.2f}s for its first token (TTFT p50 over the last {span / 60:g} min; "
            f"SLO {p.ttft_slo_s:g}s) with no queue")


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


def _open_sub_causes(
    found: list[Diagnosis], checks: Sequence[RuleCheck], state: FailureMode, blocking: tuple[str, ...],
) -> tuple[list[Diagnosis], tuple[str, ...]]:
    """The state's sub-cause is not established where a rule of the same mode and another cause
    that comes before the matched one could not be decided (``checks`` are in rule order, the
    sub-causes' precedence: the primary is the first matched): low demand on an engine without
    TTFT has not ruled out compute-bound, whose remedy is the opposite. The primary diagnosis says
    so and the signals that left it open are blocking (not harmless blind spots); the state and
    the sub-cause stay as matched. A draft (no summary yet) only gets the blocking signals."""
    primary = next((d for d in found if d.mode is state and d.cause), None)
    if primary is None:
        return found, blocking
    open_: list[RuleCheck] = []
    for c in checks:
        if c.rule_id == primary.rule_id:
            break
        if c.mode is state and c.cause and c.cause != primary.cause and c.verdict is Verdict.UNDECIDABLE:
            open_.append(c)
    if not open_:
        return found, blocking
    sigs = sorted({s for c in open_ for s in c.unknown})
    blocking = tuple(sorted({*blocking, *sigs}))
    if not primary.summary:
        return found, blocking
    causes = ", ".join(dict.fromkeys(c.cause for c in open_))
    note = f" ({causes} not ruled out: undecidable without {', '.join(sigs) or 'data'})"
    return [dataclasses.replace(d, summary=d.summary + note) if d is primary else d for d in found], blocking


def _signal_inputs(name: str) -> tuple[str, ...]:
    return DERIVED_INPUTS.get(name, (name,))


def _rule_check(
    rule: Rule, result: bool | None, unknown: Iterable[str], points: bool, conditions: Iterable[Condition],
    parts: Iterable[bool | None], uncovered: bool = False,
) -> RuleCheck:
    """The check of one rule: ``points`` counts only for an undecidable rule (or one whose
    match is not yet covered by samples)."""
    verdict = Verdict.UNDECIDABLE if result is None else Verdict.MATCHED if result else Verdict.NOT_MATCHED
    return RuleCheck(rule.id, rule.mode, rule.cause, verdict, tuple(sorted({i for u in unknown for i in _signal_inputs(u)})),
                     (result is None and points) or uncovered, tuple(conditions), tuple(parts))


def covered_s(view: TargetView, span_s: float, signal: str = Signal.KV_USAGE.value) -> float:
    """Seconds of the last ``span_s`` that ``signal``'s samples cover (KV's by default): from the
    first sample inside it (which stands for one step) to ``at``. Gaps inside are allowed (range
    queries fill them from the lookback)."""
    first = view.first_time(signal, span_s)
    if first is None:
        return 0.0
    return min(span_s, view.p.at - first + view.p.step_s)


def _span(seconds: float) -> str:
    s = round(seconds)
    return f"{s / 60:g}m" if s >= 60 else f"{s}s"


def gone_reason(view: TargetView) -> str:
    """Why the target is a blind spot whatever its rules say (stale series, no KV samples in the
    last 5 minutes while its engine exports them); empty when it is not."""
    if view.target.dialect == "stale":
        return ("target gone from scraping (no `up` series now): its incidents resolve as gone"
                if view.target.gone else
                "KV usage was reported during the window but no engine metrics exist now (scrape failing?)")
    exported = all(sig in view.data.sourced.get(view.key, set()) for sig in REQUIRED_SIGNALS)
    if exported and not view.stat(Signal.KV_USAGE.value, view.p.fresh_s, "count"):
        return "no kv_usage samples in the last 5 minutes (stale or gone target)"
    return ""


#: the KV usage range still read as a fraction: every engine exports 0-1 (Dynamo's
#: ``..._usage_percent`` too); a ratio of two gauges scraped a moment apart may overshoot a
#: little, a gauge re-exported in percent reads 5-100 and would pass for a pool at 500 %
KV_FRACTION_RANGE = (-0.05, 1.5)


def unit_reason(view: TargetView) -> str:
    """Why the KV gauge cannot be read as a fraction (a sample in the window outside
    :data:`KV_FRACTION_RANGE`); empty when it can. A percent gauge whose pool never passed
    1.5 % is not caught."""
    lo, hi = (view.stat(Signal.KV_USAGE.value, view.p.window_s, s) for s in ("min", "max"))
    if hi is not None and hi > KV_FRACTION_RANGE[1]:
        return (f"kv_usage reads up to {hi:.4g}, outside 0-1 (the fraction every engine exports): "
                "a gauge re-exported in percent? scale it by 0.01 in a recording rule or relabelling")
    if lo is not None and lo < KV_FRACTION_RANGE[0]:
        return (f"kv_usage reads down to {lo:.4g}, outside 0-1 (the fraction every engine exports): "
                "the exporter or a recording rule computes it wrongly")
    return ""


def diagnose_target(
    view: TargetView, rules: RuleSet, group: dict[str, float | None], explain: bool = False,
    facts: dict[str, float | None] | None = None, outcomes: Sequence[Outcome] | None = None,
    triage: Set[Signal] | None = None, draft: bool = False,
) -> TargetResult:
    """Classify one target. ``group`` holds replica facts computed across the fleet;
    ``explain`` records every condition of every rule (``kvwatch explain``).

    ``facts``: this target's :func:`facts_for` when already computed. ``outcomes``: each
    rule's outcome from the fleet-wide evaluator (:mod:`.fleetrules`); without them every
    rule is evaluated here by :class:`~.conditions.RuleEval` (the same results).
    ``triage`` (default: ``rules.triage_signals()``): signals only a matched rule's text reads;
    their ``(no data)`` is listed only for a target with a matched rule (collection fetches
    them only for those), a signal the target does not export at all always. ``draft``: leave
    matched rules' summary and triage text empty (a second pass with those signals renders it)."""
    p = view.p
    sourced = view.data.sourced.get(view.key, set())
    if triage is None:
        triage = rules.triage_signals()
    gaps: list[tuple[str, bool]] = []  # (blind spot, listed only with a matched rule)
    for sig, name in _ALL_SIGNALS:
        if sig not in sourced:
            if ONLY_WITHOUT.get(sig) not in sourced:  # a stand-in is no gap beside what it stands in for
                gaps.append((name, False))
        else:
            counts = view.fleet.column(name, p.window_s, "count")  # view.stat(…, "count"), 18 times a target
            if counts is None or not counts[view.row]:
                gaps.append((f"{name} (no data)", sig in triage))
    missing = [m for m, only_matched in gaps if not only_matched]
    if facts is None:
        facts = facts_for(view, group)

    def blind(reason: str, blocking: tuple[str, ...]) -> TargetResult:
        # no matched rule's text is shown, so the triage-only signals are no blind spot here
        # (the same list whether or not a second pass fetched them)
        shown = [m for m, only_matched in gaps if not only_matched]
        return TargetResult(
            view.target, FailureMode.UNKNOWN, (_unknown(view, reason),), tuple(shown), facts, blocking=blocking
        )

    unreadable = gone_reason(view) or unit_reason(view)
    if unreadable:
        return blind(unreadable, ("kv_usage",))
    # Without a KV gauge the rules are still evaluated: the modes that read the pool are
    # undecidable, but one that needs no KV can still be established and beat them all (a
    # wedged engine: full, oscillating and fragmented need progress, misread no queue). Any
    # other outcome is the blind spot, never `healthy`.
    not_exported = next((sig for sig in REQUIRED_SIGNALS if sig not in sourced), None)
    # samples that say how much of a rule's span the data cover: KV's, else the queue's
    anchor = (Signal.KV_USAGE if not_exported is None else Signal.WAITING).value
    coverage = view.stat(anchor, p.window_s, "coverage") or 0.0
    found: list[Diagnosis] = []
    checks: list[RuleCheck] = []
    not_yet: list[str] = []
    for i, rule in enumerate(rules.rules):
        ev: RuleEval | Outcome
        if outcomes is not None:
            ev = outcomes[i]
            result = ev.result
            if not result:  # not matched: targets with the same outcome share one check
                if ev.check is None:
                    ev.check = _rule_check(rule, result, ev.unknown, ev.points, ev.conditions, ev.parts)
                checks.append(ev.check)
                continue
        else:
            ev = RuleEval(view, rule, facts, explain)
            result = ev.node(rule.when)
        unknown: Set[str] = ev.unknown
        span = min(rule.for_, p.window_s)
        uncovered = False
        if result:
            covered = covered_s(view, span, anchor)
            if covered + p.step_s < span:  # one step of slack: the grid need not start on the span
                # 38 s of data cannot show "pinned for 10 min": undecidable until samples cover the span
                result, uncovered = None, True
                unknown = {*unknown, anchor}
                not_yet.append(f"rule {rule.id} matches but samples cover only {_span(covered)} "
                               f"of its {_span(span)} `for`")
        checks.append(_rule_check(rule, result, unknown, ev.points, ev.conditions, ev.parts, uncovered))
        if not result:
            continue
        ctx = TemplateContext(view, span, facts)
        found.append(
            Diagnosis(
                mode=rule.mode,
                rule_id=rule.id,
                severity=rule.severity,
                confidence=_confidence(ev, coverage),
                summary="" if draft else render(rule.summary, ctx),
                evidence=tuple(ev.evidence),
                triage=() if draft else tuple(render(t, ctx) for t in rule.triage),
                cause=rule.cause,
                for_s=rule.for_,
            )
        )
    if found and len(missing) < len(gaps):  # a matched rule's text reads the triage signals
        missing = [m for m, _ in gaps]
    found.sort(key=lambda d: d.mode.rank)
    modes = mode_verdicts(checks)
    queue_span = min(PERSISTENT_QUEUE_SPAN_S, p.window_s)
    queue_frac = view.stat("waiting", queue_span, "frac_above", 0.5)
    # two empty scrapes (and two steps) make a drained queue; the fixed minute only when the
    # scrape interval is unknown, so a 1 s scrape does not wait a minute and a 60 s one gets two
    interval = view.data.scrape_interval_s
    cleared_span = min(max(2 * p.step_s, 2 * interval if interval else QUEUE_CLEARED_S), queue_span)
    if (queue_frac is not None and (view.stat("waiting", cleared_span, "max") or 0.0) < 0.5
            and not _gap_as_before(view, p.window_s)):
        # nobody waited for two scrapes: the queue ended with a recovered episode, it is not
        # persistent (a single empty sample is not enough: the 60 s scrape that caught a drain;
        # nor is a gap the queue already made and refilled within the window)
        queue_frac = 0.0
    hidden = _hidden_queue_frac(view, queue_span)
    queue_note = ""
    if hidden is not None and hidden > (queue_frac or 0.0):
        queue_frac = hidden
        queue_note = " by their queue-time histogram (at least one waiting on average, more than the queue gauge shows)"
    decision = decide(modes, queue_frac, queue_note, _slow_first_token(view, queue_span))
    if not_exported is not None and decision.state in (FailureMode.UNKNOWN, FailureMode.HEALTHY):
        dialect = DIALECT_BY_ID.get(view.target.dialect)
        return blind((dialect.blind_reason if dialect else "") or f"{not_exported.value} is not exported",
                     (not_exported.value,))
    blocking = decision.blocking
    found, blocking = _open_sub_causes(found, checks, decision.state, blocking)
    if decision.state is FailureMode.UNKNOWN:
        structural = all(s not in sourced for s in blocking if s in Signal._value2member_map_)
        found.insert(0, _undecided(view, decision, structural))
    elif decision.state is FailureMode.HEALTHY:
        found.append(_healthy(view))
    proxy = kv_proxy(view.target.dialect)
    if proxy:  # every reader of the verdict (console, JSON, Slack, Alertmanager) sees it
        found = [dataclasses.replace(d, summary=f"{d.summary} [KV usage is a proxy: {proxy}]") for d in found]
    blind_rules = [f"rule {c.rule_id} undecidable ({', '.join(c.unknown)})" for c in checks
                   if c.verdict is Verdict.UNDECIDABLE and not any(n.startswith(f"rule {c.rule_id} ") for n in not_yet)]
    blind_rules += not_yet
    return TargetResult(
        view.target, decision.state, tuple(found), tuple(missing + blind_rules), facts,
        modes=modes, blocking=blocking, checks=tuple(checks),
    )
