"""Honest scoring of verdicts against mechanism labels: every target counts.

A verdict is compared with the label of :mod:`kvwatch.sim.mechanism` for every target of
every variant. ``unknown`` is a miss, except where the target cannot export what decides
its label: :data:`DECIDING` states, per label, the signals without which no engine-neutral
rule could decide it (``any`` of a group suffices); a target lacking all of a group (its
dialect never exports them, or the variant dropped them, see
:func:`kvwatch.sim.perturb.lacking`) may answer ``unknown`` and is then counted apart as an
*abstention*, not scored. Any other answer of an exempt target is scored like the rest,
with one exception: a ``misread`` target that cannot show TTFT (Triton, TGI, a Dynamo
worker, the no-TTFT variant) may answer what the pool is without its tail (``without_tail``
of its label: ``idle/low_demand`` or ``healthy``); that is all such an engine shows, and it
is an abstention too, not a hit. Likewise :data:`SHOWN_AS`: where an engine's own
accounting makes a label look like another mode (TGI allocates reserved blocks, so a
reservation stall reports a full pool), that other answer is an abstention too.

``misread`` is decided by TTFT *and* by ruling out the modes above it: a tail caused by a
queue (full, oscillating, fragmented) looks the same in TTFT, so a target that exports
neither a queue gauge nor preemptions (trtllm-serve gen A) cannot be told misread.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kvwatch.core.quality import Report, score
from kvwatch.sim.perturb import Variant, lacking
from kvwatch.sim.vocab import Dialect

#: label -> groups of signals; each group needs at least one of its signals to decide
#: A queue-time histogram tells the mean queue length too (Little's law: queue seconds of
#: finished requests per second), so it counts as queue evidence wherever requests still
#: leave the queue; a wedged scheduler (stalled) lets none leave, so there only the gauge does.
_QUEUE = frozenset({"waiting", "queue_time"})
DECIDING: dict[str, tuple[frozenset[str], ...]] = {
    # healthy means every mode was ruled out: without TTFT the tail (misread) cannot be,
    # without queue evidence the admission stalls (fragmented, batch-limited) cannot be
    "healthy": (frozenset({"kv_usage"}), frozenset({"ttft"}), _QUEUE),
    "full": (frozenset({"kv_usage"}), _QUEUE | {"preemptions"}),
    "oscillating": (frozenset({"kv_usage"}), _QUEUE | {"preemptions"}),
    # a policy stall and a max_num_seqs ceiling look alike (free KV, a queue) but for whether
    # running sits at its cap: without the running gauge neither can be told from the other
    "fragmented": (frozenset({"kv_usage"}), _QUEUE | {"preemptions"}, frozenset({"running"})),
    # the tail must not come from a queue: full, oscillating and fragmented need ruling out
    "misread": (frozenset({"ttft"}), frozenset({"waiting", "preemptions"})),
    # a nearly empty pool may still hold a queue (a max_num_seqs ceiling, a policy stall at
    # low usage): like healthy, low demand and compute-bound rule those out with queue evidence
    "idle/low_demand": (frozenset({"kv_usage"}), _QUEUE),
    "idle/batch_limited": (frozenset({"kv_usage"}), _QUEUE, frozenset({"running"})),
    "idle/stalled": (frozenset({"waiting"}), frozenset({"running", "token_counters", "request_counters"})),
    "idle/compute_bound": (frozenset({"kv_usage"}), frozenset({"ttft"}), _QUEUE),
}


#: exported families that are no evidence of the engine's queue: Triton's queue histogram
#: times its own scheduler queue, not the TensorRT-LLM executor's, where KV-bound requests wait
_NO_QUEUE_EVIDENCE: dict[Dialect, frozenset[str]] = {Dialect.TRTLLM_TRITON: frozenset({"queue_time"})}


#: dialect -> {label: the answer that is all the dialect shows of that label}. TGI v3 admits a
#: request by allocating blocks for prompt + max_new_tokens (backends/v3/src/queue.rs) and its
#: only KV gauge, ``tgi_batch_current_max_tokens``, sums those: a reservation-bound pool has
#: no free blocks in TGI's accounting and reports itself full, never the headroom fragmented
#: needs (failure-modes.md). The sim also draws watermark-only stalls on TGI, which do report
#: headroom; a ``full`` there is excused too (a looseness, not a credit: abstentions are not scored).
SHOWN_AS: dict[Dialect, dict[str, str]] = {Dialect.TGI: {"fragmented": "full"}}


def label_key(mode: str, cause: str | None) -> str:
    return f"{mode}/{cause}" if mode == "idle" and cause else mode


def blind_to(label: str, missing: frozenset[str]) -> frozenset[str]:
    """The deciding groups of ``label`` that ``missing`` empties (as their signal names)."""
    return frozenset(s for g in DECIDING[label] if g <= missing for s in g)


@dataclass(frozen=True)
class Verdict:
    """One scored target of one variant."""

    variant: str
    instance: str
    dialect: str
    expected: str  # label key: mode or idle/cause
    got: str  # state, idle/cause for idle; "unknown", "missing"
    exempt: frozenset[str]
    persistent_queue: bool
    rule: str = ""
    without_tail: str | None = None  # misread label: what the pool is without its tail
    shown_as: str | None = None  # what the dialect's own accounting shows of the label (SHOWN_AS)

    @property
    def abstained(self) -> bool:
        if self.shown_as is not None and self.got == self.shown_as:
            return True
        if not self.exempt:
            return False
        return self.got == "unknown" or ("ttft" in self.exempt and self.got == self.without_tail)

    @property
    def mode_pair(self) -> tuple[str, str]:
        return self.expected.split("/")[0], self.got.split("/")[0]


@dataclass
class HonestReport:
    verdicts: list[Verdict] = field(default_factory=list)

    def scored(self, variant: str | None = None) -> list[Verdict]:
        return [v for v in self.verdicts if not v.abstained and (variant is None or v.variant == variant)]

    def modes(self, variant: str | None = None) -> Report:
        """Six modes (idle sub-causes folded)."""
        return score(v.mode_pair for v in self.scored(variant))

    def causes(self, variant: str | None = None) -> Counter[tuple[str, str]]:
        """(expected idle/cause, got) counts for idle targets."""
        return Counter((v.expected, v.got) for v in self.scored(variant) if v.expected.startswith("idle"))

    def healthy_flagged(self, variant: str | None = None) -> list[Verdict]:
        """Healthy targets given a failure mode (``unknown`` is counted apart)."""
        return [v for v in self.scored(variant) if v.expected == "healthy" and v.got not in ("healthy", "unknown")]

    def healthy_unknown(self, variant: str | None = None) -> list[Verdict]:
        return [v for v in self.scored(variant) if v.expected == "healthy" and v.got == "unknown"]

    def queue_called_healthy(self, variant: str | None = None) -> list[Verdict]:
        return [v for v in self.verdicts if (variant is None or v.variant == variant)
                and v.persistent_queue and v.got == "healthy"]

    def failure_called_healthy(self, variant: str | None = None) -> list[Verdict]:
        return [v for v in self.verdicts if (variant is None or v.variant == variant)
                and v.expected != "healthy" and v.got == "healthy"]

    def abstentions(self, variant: str | None = None) -> list[Verdict]:
        return [v for v in self.verdicts if v.abstained and (variant is None or v.variant == variant)]

    def against_base(self, variant: str) -> tuple[Report, list[Verdict], list[Verdict]]:
        """The perturbation's own effect, free of which targets it was drawn on: (the base
        variant's scores on the same targets — those scored in ``variant`` —, the verdicts
        that changed from base, those that changed to ``healthy``)."""
        base = {v.instance: v for v in self.verdicts if v.variant == "base"}
        mine = [v for v in self.verdicts if v.variant == variant and v.instance in base]
        same = score(base[v.instance].mode_pair for v in mine if not v.abstained)
        changed = [v for v in mine if v.got != base[v.instance].got]
        return same, changed, [v for v in changed if v.got == "healthy"]

    def misses(self) -> list[Verdict]:
        return [v for v in self.scored() if v.expected != v.got]


def got_key(state: str, cause: str | None) -> str:
    return label_key(state, cause)


def score_corpus(manifest: Mapping[str, object], results: Mapping[tuple[str, str], tuple[str, str | None, str]],
                 variants: Iterable[Variant]) -> HonestReport:
    """Score ``results`` ((job, instance) -> (state, idle cause, rule id)) of every variant
    written in ``manifest`` (see :func:`kvwatch.sim.randomized.build`)."""
    targets = {t["instance"]: t for t in manifest["targets"]}  # type: ignore[index, union-attr]
    by_name = {v.name: v for v in variants}
    rep = HonestReport()
    for vdoc in manifest["variants"]:  # type: ignore[union-attr]
        variant = by_name[vdoc["name"]]
        for inst in vdoc["instances"]:
            t = targets[inst]
            expected = label_key(t["expected"], t["cause"])
            dialect = Dialect(t["dialect"])
            missing = lacking(dialect, variant) | _NO_QUEUE_EVIDENCE.get(dialect, frozenset())
            state, cause, rule = results.get((vdoc["job"], inst), ("missing", None, ""))
            rep.verdicts.append(Verdict(variant.name, inst, t["dialect"], expected, got_key(state, cause),
                                        blind_to(expected, missing), bool(t["persistent_queue"]), rule,
                                        t.get("without_tail"), SHOWN_AS.get(dialect, {}).get(expected)))
    return rep
