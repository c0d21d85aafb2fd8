"""Classification rules: YAML files validated and compiled at load.

A rule file holds ``version: 1`` and a list of ``rules``. Each rule names a
failure mode, a severity, a persistence span (``for``), a condition tree
(``all`` / ``any`` / ``not`` over leaves) and templates for the summary and the
ordered triage steps. Leaves compare one statistic of one signal over a span
(the rule's ``for`` tail or the whole ``window``), or one target fact:

    - {signal: kv_usage, stat: frac_above, arg: 0.9, op: ">=", value: 0.8}
    - {signal: waiting, stat: mean, op: ">=", value: 1, over: window}
    - {fact: group_size, op: ">=", value: 3}

Every problem is reported as ``file: rules[i] (id): key: message``, all at once.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from kvwatch.config import Duration, read_yaml
from kvwatch.core.models import FailureMode, Severity
from kvwatch.core.signals import REQUIRED_SIGNALS, Signal
from kvwatch.core.statistics.registry import RULE_STATS
from kvwatch.errors import ConfigError, Problem

#: signals derived point-wise from canonical signals (or one shifted in time)
DERIVED_SIGNALS: dict[str, str] = {
    "ttft_tail_ratio": "ttft_p99 / ttft_p50",
    "queue_tail_share": "queue_p99 / ttft_p99 where ttft_p99 breaks the TTFT SLO (NaN elsewhere): how much of a tail "
                        "over the SLO is time in the queue",
    "ttft_p99_prior": "ttft_p99 one latency window earlier (a gap for the first window): the tail before the newest "
                      "window's requests",
    "running_vs_cap": "running / max_running",
    "running_vs_cap_queued": "running / max_running except where nobody waits (waiting < 0.5: a gap); no waiting: every sample",
    "completion_rate": "request_rate - abort_rate (abort_rate absent: 0; request_rate as is where the engine's "
                       "counter holds successes only, TGI and Triton), requests/s that completed",
    "running_queued": "running except where nobody waits (waiting < 0.5: a gap); no waiting: every sample",
    "queue_wait": "waiting / request_rate, s: Little's-law time in queue (0 with nobody waiting; a gap while nothing finishes)",
    "kv_queued": "kv_usage at the samples where requests waited (waiting >= 1), a gap elsewhere",
    "peak_pressure": "1 where requests waited two samples running (waiting >= 1), waited >= 15 s of throughput "
                     "(queue_wait) or were preempted in a burst (>= 5 % of the requests finishing), 0 where none of these, "
                     "a gap where none is known",
    "running_vs_queued_max": "running / the most that ran at this or any earlier sample of the window where requests "
                             "waited (waiting >= 0.5); a gap until the first such sample",
}
#: the canonical signals each derived signal is computed from
DERIVED_INPUTS: dict[str, tuple[str, ...]] = {
    "ttft_tail_ratio": ("ttft_p99", "ttft_p50"),
    "queue_tail_share": ("queue_p99", "ttft_p99"),
    "ttft_p99_prior": ("ttft_p99",),
    "running_vs_cap": ("running", "max_running"),
    "running_vs_cap_queued": ("running", "max_running"),  # waiting only narrows the samples
    "completion_rate": ("request_rate", "abort_rate"),
    "running_queued": ("running",),  # waiting only narrows the samples
    "queue_wait": ("waiting", "request_rate"),
    "running_vs_queued_max": ("running", "waiting"),
    "peak_pressure": ("waiting", "request_rate", "preemptions"),
    "kv_queued": ("kv_usage", "waiting"),
}
#: derived signals that are a histogram quantile themselves (shifted in time): they read in that
#: quantile's bucket layout, so a value in the threshold's own bucket is not established
QUANTILE_OF: dict[str, Signal] = {"ttft_p99_prior": Signal.TTFT_P99}


def bucket_signal(name: str) -> Signal | None:
    """The histogram quantile whose bucket layout signal ``name`` reads in (itself when canonical)."""
    return Signal._value2member_map_.get(name) or QUANTILE_OF.get(name)  # type: ignore[return-value]

SIGNAL_NAMES: frozenset[str] = frozenset({s.value for s in Signal} | set(DERIVED_SIGNALS))
#: canonical signals the diagnosis core reads for every target whatever the rules say
#: (``diagnose/facts.py``: capacity and cap facts; ``diagnose/target.py``: the queue)
CORE_SIGNALS: frozenset[Signal] = frozenset(
    {Signal.KV_USAGE, Signal.KV_CAPACITY_TOKENS, Signal.MAX_RUNNING, Signal.WAITING, Signal.GEN_TPS,
     Signal.PROMPT_TPS, Signal.REQUEST_RATE})

#: per-target scalar facts computed by the diagnosis core (see diagnose.facts_for)
FACTS: dict[str, str] = {
    "capacity_tokens": "KV pool size in tokens the engine reports",
    "used_tokens": "tokens in use now (usage x capacity)",
    "headroom_tokens": "free KV tokens now",
    "tokens_per_request": "mean prompt+output tokens per finished request over the window",
    "headroom_requests": "requests of average size that still fit",
    "max_running": "configured max concurrent requests, where exported",
    "group_size": "replicas in the same job and model",
    "group_kv_usage_median": "median of the other replicas' mean KV usage",
    "group_kv_usage_mean": "fleet (group) mean KV usage incl. this replica",
    "kv_usage_vs_group": "this replica's mean KV usage minus the others' median",
    "ttft_slo": "configured TTFT SLO in seconds",
    "finishes_per_step": "requests finishing in one engine step where the running gauge is read after they left "
                         "(vLLM, SGLang): finished/s x the step (running / tokens/s, else the mean inter-token latency) over "
                         "10 minutes; a batch at its cap reads the cap with probability e^-finishes_per_step. 0 where "
                         "the gauge counts them (the cap itself is read); none without request counters, or without "
                         "both token counters and a token-latency histogram",
    "finish_dip": "how far under its cap (requests) such a gauge's 10th percentile may sit from those finishes "
                  "alone: finishes_per_step + 2 sqrt(finishes_per_step) + 1; 0 where the gauge counts them",
    "cap_share": "the least share of samples such a gauge reads at the cap itself: e^-finishes_per_step less "
                 "0.25 (2.5 sd of 21 samples), 0 from 1.4 finishes per step on; 1 where the gauge counts them",
    "waiting_counts_prefill": "1 where the engine's queue gauge also counts requests in prefill (Dynamo frontend; "
                              "kvwatch then reads as waiting only the part a within-SLO prefill cannot hold: diagnose/prefill.py), else 0",
    "waiting_estimated": "1 where waiting is the Little's-law estimate from the queue-time histogram (no queue gauge: "
                         "smoothed over the rate window, it lags and never drains between close peaks), else 0",
    "tokens_at_finish": "1 where the token counter behind gen_tps adds a request's tokens when it finishes, not per "
                        "step (SGLang's generation_tokens_total, per-request histogram sums): a zero rate there is "
                        "only 'no request finished', else 0",
    "queue_shows_stalls": "1 where the queue reading shows the requests a wedged scheduler holds; no number (a rule "
                          "reading it is undecidable) where it cannot: an executor queue alone (admitted requests "
                          "uncounted) or a Little's-law estimate (a stuck request never reports its queue time)",
    "latency_requests": "requests the newest latency quantile summarises: finished requests/s over the latency "
                        "window x that window (a p99 of a dozen requests is their slowest one)",
    "queue_drain_share": "the share of the queue its trend over the last 10 minutes removes per minute (fall per "
                         "minute / requests waiting now, at least one): 0.1 or more empties it within 10 minutes, "
                         "0 where it holds or grows; no number without a queue reading",
    "latency_reach_s": "how far back (s) the requests in the newest latency quantile may have waited: "
                       "the latency window + the sample's age (coarse sampling) + one step",
    "queue_reach_s": "how long (s) the last queue reading must be past for the newest latency quantile to hold "
                     "no queued request: latency_reach_s, less the rate window where waiting is a Little's-law "
                     "estimate (it reads a wait when the request leaves the queue and holds it a rate window)",
    "preemption_reach_s": "how long (s) the preemption rate must have read none for the newest latency quantile "
                          "to hold no request of a preemption: latency_reach_s less the rate window (a rate reads "
                          "an event for a rate window after it)",
    "queue_mean_recency_s": "how old (s) the last queue-time mean reading a queue may be for that queue to lie "
                            "within oscillating's 10-minute recency: 600 s less the span the mean is taken over (the "
                            "latency window for a histogram mean, the rate window for Triton's counters); 0 from a "
                            "10-minute span on (the mean must read it at the last sample)",
    "period": "dominant period of KV usage (of running where KV barely moves) over the window, seconds; "
              "none above half the window (two cycles at least)",
    "period_minutes": "dominant period of KV usage (of running where KV barely moves), minutes",
    "kv_cycles": "fill/drain cycles of KV usage (>=0.8 then <=0.4) over the window",
    "capacity_requests": "average-size requests the whole pool holds",
}

Op = Literal[">", ">=", "<", "<=", "==", "!="]


class _M(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Leaf(_M):
    signal: str | None = None
    fact: str | None = None
    stat: str = "mean"
    arg: float | None = None
    op: Op
    value: float | None = None
    #: compare against a fact (e.g. ttft_slo) times ``value`` (default 1) instead of a constant
    ref: str | None = None
    over: Literal["for", "window"] = "for"
    #: how an uncomputable statistic counts: "unknown" (default, the rule may become
    #: undecidable), or "false"/"true" for optional evidence such as a cap few engines export
    missing: Literal["unknown", "false", "true"] = "unknown"
    #: a guard only excludes look-alikes ("no sustained queue", "not KV-pinned"): when the
    #: rule is undecidable, a met guard does not count as evidence pointing to the mode
    guard: bool = False
    #: how a comparison counts when an interpolated quantile lies in the threshold's own
    #: histogram bucket (the true value may be on either side): "false" (default, never
    #: evidence), or "true" for a "still so now" check whose past the rest of the rule has
    #: established (a newest quantile that cannot say which side it is on does not show a
    #: change)
    straddled: Literal["false", "true"] = "false"

    def straddled_result(self, negated: bool) -> bool:
        """What the leaf returns when its quantile lies in the threshold's own bucket: not
        established (False; True under `not`, so the group it negates fails), unless the leaf
        counts a straddled bucket as met. One definition for the fleet kernel and explain."""
        return negated or self.straddled == "true"

    def threshold(self, facts: dict[str, float | None]) -> float | None:
        """The number this leaf compares against (None when its reference fact is unknown)."""
        if self.ref is None:
            return self.value
        base = facts.get(self.ref)
        return None if base is None else base * (1.0 if self.value is None else self.value)

    # per-field checks so that errors name the offending key (file → rule → when… → signal)
    @field_validator("signal")
    @classmethod
    def _signal(cls, v: str | None) -> str | None:
        if v is not None and v not in SIGNAL_NAMES:
            raise ValueError(f"unknown signal {v!r} (expected one of {', '.join(sorted(SIGNAL_NAMES))})")
        return v

    @field_validator("fact", "ref")
    @classmethod
    def _fact(cls, v: str | None) -> str | None:
        if v is not None and v not in FACTS:
            raise ValueError(f"unknown fact {v!r} (expected one of {', '.join(sorted(FACTS))})")
        return v

    @field_validator("stat")
    @classmethod
    def _stat(cls, v: str) -> str:
        if v not in RULE_STATS:
            raise ValueError(f"unknown stat {v!r} (expected one of {', '.join(sorted(RULE_STATS))})")
        return v

    @model_validator(mode="after")
    def _check(self) -> Leaf:
        if (self.signal is None) == (self.fact is None):
            raise ValueError("a condition needs exactly one of 'signal' or 'fact'")
        if self.value is None and self.ref is None:
            raise ValueError("a condition needs a 'value' (or a 'ref' fact to compare against)")
        if self.signal is not None and RULE_STATS[self.stat] and self.arg is None:
            raise ValueError(f"stat {self.stat!r} needs an 'arg'")
        return self


class Group(_M):
    all: tuple[Node, ...] | None = None
    any: tuple[Node, ...] | None = None
    not_: Node | None = Field(None, alias="not")

    @model_validator(mode="after")
    def _one(self) -> Group:
        n = sum(x is not None for x in (self.all, self.any, self.not_))
        if n != 1:
            raise ValueError("a condition group needs exactly one of 'all', 'any', 'not'")
        if (self.all is not None and not self.all) or (self.any is not None and not self.any):
            raise ValueError("'all'/'any' need at least one condition")
        return self


def _node_kind(raw: Any) -> str:
    """Pick the branch from the keys present, so a bad leaf is not also reported as a bad group."""
    keys = raw.keys() if isinstance(raw, dict) else vars(raw) if isinstance(raw, BaseModel) else ()
    return "group" if {"all", "any", "not", "not_"} & set(keys) else "leaf"


# pydantic needs the forward-referenced union
Node = Annotated[
    Union[Annotated[Group, Tag("group")], Annotated[Leaf, Tag("leaf")]],  # noqa: UP007
    Discriminator(_node_kind),
]
Group.model_rebuild()


class Rule(_M):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    mode: FailureMode
    severity: Severity = Severity.WARNING
    cause: str = ""
    description: str = ""
    for_: Duration = Field(600.0, alias="for")
    summary: str
    when: Group
    triage: tuple[str, ...] = Field(min_length=1)

    @field_validator("mode")
    @classmethod
    def _mode(cls, v: FailureMode) -> FailureMode:
        if v in (FailureMode.HEALTHY, FailureMode.UNKNOWN):
            raise ValueError("rules classify failure modes; 'healthy' and 'unknown' are decided by kvwatch itself")
        return v

    def leaves(self) -> Iterable[Leaf]:
        stack: list[Node] = [self.when]
        while stack:
            n = stack.pop()
            if isinstance(n, Leaf):
                yield n
            else:
                stack.extend(n.all or ())
                stack.extend(n.any or ())
                if n.not_ is not None:
                    stack.append(n.not_)

    def signals(self) -> frozenset[str]:
        return frozenset(leaf.signal for leaf in self.leaves() if leaf.signal)


class RuleFile(_M):
    version: Literal[1]
    rules: tuple[Rule, ...] = ()


@dataclass(frozen=True)
class RuleSet:
    """Rules from all files, in file then declaration order (order breaks ties within a mode)."""

    rules: tuple[Rule, ...]
    sources: tuple[str, ...]

    def by_mode(self, mode: FailureMode) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.mode is mode)

    def condition_signals(self) -> frozenset[Signal]:
        """Canonical signals some rule condition reads (derived signals expanded).

        These need a time series over the window; the others only fill triage text.
        """
        names: set[str] = {s.value for s in REQUIRED_SIGNALS}
        for r in self.rules:
            for leaf in r.leaves():
                for name in (leaf.signal, leaf.ref):
                    if name:
                        names.update(DERIVED_INPUTS.get(name, (name,)))
        # facts computed from series: tokens per request, the replica group, the period, the
        # finished requests per step (its step from the token latency where no tokens are counted)
        names.update(("kv_usage", "gen_tps", "prompt_tps", "request_rate", "itl_mean"))
        return frozenset(Signal(n) for n in names if n in Signal._value2member_map_)

    def decision_signals(self) -> frozenset[Signal]:
        """Signals every target's result depends on: the rule conditions' and the ones the core
        reads for every target outside them (facts: pool size and concurrency cap; the state's
        persistent-queue check and the healthy summary: the queue)."""
        return self.condition_signals() | CORE_SIGNALS

    def triage_signals(self) -> frozenset[Signal]:
        """Signals only a matched rule's summary and triage text read (today ITL and TPOT p99).

        A cycle fetches them only for the targets with a finding, and a target without one
        does not list them as blind spots (``(no data)``): they decide nothing."""
        return frozenset(Signal) - self.decision_signals()


#: bare template names besides the facts
TEMPLATE_SPANS: dict[str, str] = {
    "for_minutes": "the rule's `for` in minutes",
    "window_minutes": "the evaluation window in minutes",
}
# [[fill]align][sign][z][#][0][width][grouping][.precision][type]; width/precision capped so a
# template cannot ask for a million-character field
_SPEC = re.compile(r"(?:.?[<>=^])?[+\- ]?z?#?0?(?P<width>\d{0,3})[,_]?(?:\.\d{1,2})?[bcdeEfFgGnosxX%]?", re.S)
_MAX_WIDTH = 80


def _check_field(field: str) -> str | None:
    """``fact`` | ``for_minutes`` | ``signal.stat`` | ``window.signal.stat``, nothing else."""
    if not field:
        return "positional fields '{}' are not allowed: name a fact or signal.stat"
    if not re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)*", field):
        return f"field {{{field}}}: only fact, signal.stat or window.signal.stat (no attribute or item access)"
    parts = field.split(".")
    if parts[0] == "window" and len(parts) == 3:
        parts = parts[1:]
    if len(parts) == 1:
        if parts[0] in FACTS or parts[0] in TEMPLATE_SPANS:
            return None
        return f"field {{{field}}}: unknown name {parts[0]!r} (expected a fact: {', '.join(sorted([*FACTS, *TEMPLATE_SPANS]))})"
    if len(parts) == 2:
        sig, stat = parts
        if sig not in SIGNAL_NAMES:
            return f"field {{{field}}}: unknown name {sig!r} (not a signal)"
        if stat not in RULE_STATS or RULE_STATS[stat]:
            usable = sorted(k for k, needs_arg in RULE_STATS.items() if not needs_arg)
            return f"field {{{field}}}: {stat!r} is not a template statistic (expected one of {', '.join(usable)})"
        return None
    return f"field {{{field}}}: only fact, signal.stat or window.signal.stat (no attribute or item access)"


def check_template(text: str) -> str | None:
    """Why ``text`` is not an allowed rule template, or None.

    Templates read documented statistics and facts only: no attribute or item
    access beyond ``signal.stat`` (so ``{capacity_tokens.__init__.__globals__}``
    is refused), no ``!r``/``!s`` conversions, no nested fields in format specs,
    format widths at most 80.
    """
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        return f"bad template: {exc}"
    for _lit, field, spec, conv in parsed:
        if field is None:
            continue
        err = _check_field(field)
        if err:
            return err
        if conv:
            return f"field {{{field}!{conv}}}: conversions are not allowed"
        m = _SPEC.fullmatch(spec or "")
        if m is None or "{" in (spec or ""):
            return f"field {{{field}:{spec}}}: invalid format spec {spec!r}"
        if m.group("width") and int(m.group("width")) > _MAX_WIDTH:
            return f"field {{{field}:{spec}}}: width above {_MAX_WIDTH}"
    return None


def _rule_label(raw: Any, i: int) -> str:
    rid = raw.get("id") if isinstance(raw, dict) else None
    return f"rules[{i}] ({rid})" if rid else f"rules[{i}]"


def load_rule_file(path: Path) -> tuple[Rule, ...]:
    """Validate one file; raise ConfigError listing every problem with file → rule → key."""
    doc = read_yaml(path)
    raw_rules = doc.get("rules") if isinstance(doc.get("rules"), list) else []
    try:
        rf = RuleFile.model_validate(doc)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = list(err["loc"])
            where = ".".join(str(p) for p in loc)
            if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
                rest = ".".join(str(p) for p in loc[2:] if p not in ("group", "leaf"))
                where = f"{_rule_label(raw_rules[loc[1]] if loc[1] < len(raw_rules) else None, loc[1])}: {rest}"
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            elif err["type"] == "missing":
                msg = "required key is missing"
            elif "input" in err and err["type"] not in ("value_error",):
                msg = f"got {err['input']!r}: {msg}"
            problems.append(Problem(str(path), where, msg))
        raise ConfigError(problems) from None
    problems = []
    for i, rule in enumerate(rf.rules):
        for key, text in [("summary", rule.summary), *((f"triage[{j}]", t) for j, t in enumerate(rule.triage))]:
            err = check_template(text)
            if err:
                problems.append(Problem(str(path), f"rules[{i}] ({rule.id}): {key}", err))
    if problems:
        raise ConfigError(problems)
    return rf.rules


def default_rules_dir() -> Path:
    """The bundled rule directory: installed wheel copy, else the source checkout's rules/kvwatch."""
    here = Path(__file__).resolve().parent.parent  # the kvwatch package (this file is kvwatch/core/rules.py)
    for cand in (here / "_bundled" / "rules" / "kvwatch", here.parent / "rules" / "kvwatch"):
        if cand.is_dir():
            return cand
    raise ConfigError(Problem("rules", "", f"no bundled rules found next to {here}"))


def load_ruleset(paths: Iterable[str | Path] = ()) -> RuleSet:
    """Load rule files (directories expand to their ``*.yaml``); ids must be unique across files."""
    files: list[Path] = []
    for p in list(paths) or [default_rules_dir()]:
        p = Path(p)
        try:
            if p.is_dir():
                files.extend(sorted(p.glob("*.y*ml")))
            elif p.exists():
                files.append(p)
            else:
                raise ConfigError(Problem(str(p), "", "rule file or directory does not exist"))
        except OSError as exc:  # name too long, permission denied on a parent, ...
            raise ConfigError(Problem(str(p), "", f"cannot read: {exc.strerror or exc}")) from None
    if not files:
        raise ConfigError(Problem(", ".join(str(p) for p in paths), "", "no *.yaml rule files found"))
    rules: list[Rule] = []
    problems: list[Problem] = []
    seen: dict[str, Path] = {}
    for f in files:
        try:
            loaded = load_rule_file(f)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        for r in loaded:
            if r.id in seen:
                problems.append(Problem(str(f), f"rule {r.id}", f"duplicate id (first defined in {seen[r.id]})"))
            seen[r.id] = f
            rules.append(r)
    if problems:
        raise ConfigError(problems)
    return RuleSet(tuple(rules), tuple(str(f) for f in files))
