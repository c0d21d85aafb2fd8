"""Three-valued verdicts: rule outcomes → one verdict per failure mode → the target state.

Pure and small on purpose: the contract "``healthy`` means every mode was decided and
none matched" lives here and nowhere else.

* A mode is *matched* when one of its rules matched, *not matched* when every rule was
  decided false, else *undecidable* (a rule could not be decided for lack of signals
  and nothing known rules it out).
* The state is the first matched mode in precedence order — unless a higher-precedence
  mode is undecidable while the known evidence points to it (KV pinned but the pressure
  signals are missing; a queue but progress unknown): then ``unknown``.
* No mode matched: ``unknown`` if any mode is undecidable, if requests queue
  persistently (a persistent queue is never healthy), or if the typical request's first
  token breaks the SLO without a queue; otherwise ``healthy``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvwatch.core.models import PRECEDENCE, FailureMode, ModeVerdict, RuleCheck, Verdict

#: fraction of :data:`PERSISTENT_QUEUE_SPAN_S` with ≥ 1 request waiting above which a queue
#: is "persistent": healthy is "~no queue" (failure-modes.md), and a queue in a third of the
#: last 10 minutes that no rule explains is a blind spot, not health (a Triton oscillation
#: whose queue no rule read, 23 24 rnd-23-042); the odd request caught waiting is far below
PERSISTENT_QUEUE_FRAC = 0.25
#: span of the persistent-queue check, s: recent, so a queue that ended with a recovered
#: episode does not linger as an after-effect over the whole 30-minute window
PERSISTENT_QUEUE_SPAN_S = 600.0

#: how long the queue must have been empty, s, before a queue that was persistent counts as
#: over (an after-effect of a recovered episode), when the scrape interval is unknown; with it
#: known, two scrape intervals (and two steps). One empty sample is a drain caught by the last
#: scrape (a 60 s scrape, a periodic cycle ending at its trough), not a recovery
QUEUE_CLEARED_S = 60.0

_MODES: tuple[FailureMode, ...] = tuple(m for m in PRECEDENCE if m is not FailureMode.HEALTHY)
_NOT_MATCHED: dict[FailureMode, ModeVerdict] = {m: ModeVerdict(m, Verdict.NOT_MATCHED) for m in _MODES}


def mode_verdicts(checks: Sequence[RuleCheck]) -> tuple[ModeVerdict, ...]:
    """One verdict per failure mode, in precedence order (a mode without rules is not matched)."""
    by_mode: dict[FailureMode, list[RuleCheck]] = {}
    for c in checks:  # one pass (a target has a dozen checks, a fleet thousands of targets)
        by_mode.setdefault(c.mode, []).append(c)
    out: list[ModeVerdict] = []
    for mode in _MODES:
        rules = by_mode.get(mode)
        if not rules or all(c.verdict is Verdict.NOT_MATCHED for c in rules):
            out.append(_NOT_MATCHED[mode])
            continue
        matched = tuple(c.rule_id for c in rules if c.verdict is Verdict.MATCHED)
        if matched:
            out.append(ModeVerdict(mode, Verdict.MATCHED, matched))
            continue
        und = [c for c in rules if c.verdict is Verdict.UNDECIDABLE]
        if und:
            blocking = tuple(sorted({s for c in und for s in c.unknown}))
            points = any(c.points for c in und)
            out.append(ModeVerdict(mode, Verdict.UNDECIDABLE, tuple(c.rule_id for c in und), blocking, points))
        else:
            out.append(ModeVerdict(mode, Verdict.NOT_MATCHED))
    return tuple(out)


@dataclass(frozen=True)
class StateDecision:
    """The target state and, for ``unknown``, why and which signals blocked the decision.

    ``urgent``: the blindness hides a likely problem (evidence points to an undecidable
    mode, or a persistent queue), as opposed to a mode this engine cannot show at all.
    """

    state: FailureMode
    reason: str = ""
    blocking: tuple[str, ...] = ()
    urgent: bool = False


def _why(modes: Sequence[ModeVerdict]) -> str:
    parts = []
    for v in modes:
        what = f"{v.mode.value} undecidable without {', '.join(v.blocking) or 'data'}"
        if v.points:
            what += " (the known evidence points to it)"
        parts.append(what)
    return "; ".join(parts)


def decide(modes: Sequence[ModeVerdict], queue_frac: float | None, queue_note: str = "",
           slow_first_token: str = "") -> StateDecision:
    """The target state from the mode verdicts (precedence order) and the fraction of the
    last :data:`PERSISTENT_QUEUE_SPAN_S` with a queue (None: unknown); ``queue_note`` says how
    that queue was read where not from the queue gauge. ``slow_first_token`` (empty: no) says
    the typical request breaks the TTFT SLO without a queue: like a persistent queue, never
    healthy."""
    pointing: list[ModeVerdict] = []
    for v in modes:
        if v.verdict is Verdict.MATCHED:
            if pointing:
                blocking = tuple(sorted({s for p in pointing for s in p.blocking}))
                reason = f"{_why(pointing)}, so {v.mode.value} cannot be the verdict"
                return StateDecision(FailureMode.UNKNOWN, reason, blocking, urgent=True)
            return StateDecision(v.mode)
        if v.verdict is Verdict.UNDECIDABLE and v.points:
            pointing.append(v)
    undecided = [v for v in modes if v.verdict is Verdict.UNDECIDABLE]
    queued = queue_frac is not None and queue_frac > PERSISTENT_QUEUE_FRAC
    queue = (f"requests queued in {queue_frac:.0%} of the last {PERSISTENT_QUEUE_SPAN_S / 60:g} minutes{queue_note}"
             if queued else "")
    if undecided:
        blocking = tuple(sorted({s for v in undecided for s in v.blocking}))
        reason = _why(undecided) + (f"; {queue}" if queued else "")
        return StateDecision(FailureMode.UNKNOWN, reason, blocking, urgent=bool(pointing) or queued)
    if queued:
        return StateDecision(FailureMode.UNKNOWN, f"{queue} but no failure-mode rule explains it", (), urgent=True)
    if slow_first_token:
        return StateDecision(FailureMode.UNKNOWN, f"{slow_first_token} but no failure-mode rule explains it", (),
                             urgent=True)
    return StateDecision(FailureMode.HEALTHY)
