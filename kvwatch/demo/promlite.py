"""A dialect :class:`~kvwatch.core.dialects.Source` evaluated on one simulated engine's exposition.

The in-process demo has no Prometheus, so it applies each source's PromQL shape to the
series the simulated engine exposes (its real names, labels and histogram buckets):
label matchers select series (an absent label equals ``""``), gauges aggregate with the
source's ``agg``, counters go through ``rate()`` first, histograms through
``histogram_quantile`` over ``sum by (le)`` of bucket rates, means through
``rate(sum)/rate(count)``. ``None`` means the query would return nothing (no series
match), which kvwatch reports as "(no data)". ``EXPR`` sources (hand-written PromQL)
are not interpreted: :func:`expr_fallback` gives their documented meaning from the
simulator's ground truth instead.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from kvwatch.core.collect import cache_info_tokens
from kvwatch.core.dialects import TRITON_LLM_MARKER, Source, SourceKind
from kvwatch.core.selector import Matcher, parse_selector
from kvwatch.core.signals import Signal
from kvwatch.demo.groundtruth import histogram_mean, histogram_quantile, rate
from kvwatch.sim.expose import Family, Sample
from kvwatch.sim.fleet import TargetRun


def _matches(labels: dict[str, str], matchers: Sequence[Matcher]) -> bool:
    for m in matchers:
        v = labels.get(m.label, "")
        if (m.op == "=" and v != m.value) or (m.op == "!=" and v == m.value):
            return False
        if m.op in ("=~", "!~") and (re.fullmatch(m.value, v) is None) == (m.op == "=~"):
            return False
    return True


class Exposed:
    """The series of one engine instance over its scrape times ``t`` (Unix s)."""

    def __init__(self, fams: Sequence[Family], t: np.ndarray) -> None:
        self.t = t
        self._by_name: dict[str, list[Sample]] = defaultdict(list)
        for fam in fams:
            for s in fam.samples:
                self._by_name[s.name].append(s)

    @property
    def names(self) -> set[str]:
        return set(self._by_name)

    def labels(self, name: str) -> list[dict[str, str]]:
        return [dict(s.labels) for s in self._by_name.get(name, ())]

    def select(self, name: str, matchers: Sequence[Matcher]) -> list[tuple[dict[str, str], np.ndarray]]:
        """(labels, values over ``t``) of every series named ``name`` that the matchers accept."""
        out = []
        for s in self._by_name.get(name, ()):
            lb = dict(s.labels)
            if _matches(lb, matchers):
                out.append((lb, np.broadcast_to(np.asarray(s.value, dtype=float), self.t.shape).copy()))
        return out


def _agg(values: list[np.ndarray], how: str) -> np.ndarray:
    """``sum``/``max`` across series per instant over the series that have a value;
    NaN (no result) where none has."""
    stack = np.vstack(values)
    none = np.isnan(stack).all(axis=0)
    filled = np.where(np.isnan(stack), 0.0 if how == "sum" else -np.inf, stack)
    out = filled.sum(axis=0) if how == "sum" else filled.max(axis=0)
    return np.where(none, np.nan, out)


def _summed(series: list[tuple[dict[str, str], np.ndarray]]) -> np.ndarray | None:
    return np.sum([v for _, v in series], axis=0) if series else None


def evaluate_source(src: Source, exposed: Exposed, rate_window: float, latency_window: float
                    ) -> np.ndarray | None:
    """The signal ``src`` yields on the scrape times; None when its query returns nothing
    (and for ``EXPR`` sources, which this does not interpret)."""
    matchers = parse_selector(src.matchers, f"source {src.metric}")
    if src.triton_core:  # only the model(s) that export the TensorRT-LLM backend's metrics
        llm = sorted({lb.get("model", "") for lb in exposed.labels(TRITON_LLM_MARKER)})
        matchers = [*matchers, Matcher("model", "=~", "|".join(re.escape(m) for m in llm) or "^$")]
    t = exposed.t
    k = src.kind
    out: np.ndarray | None
    if k is SourceKind.GAUGE:
        series = exposed.select(src.metric, matchers)
        out = _agg([v for _, v in series], src.agg) if series else None
    elif k is SourceKind.COUNTER:
        series = exposed.select(src.metric, matchers)
        out = _agg([rate(v, t, rate_window) for _, v in series], src.agg) if series else None
        if out is None and src.lazy_anchor and exposed.labels(src.lazy_anchor):
            out = np.zeros(len(t))  # created at the first event: none yet
    elif k is SourceKind.HIST_QUANTILE:
        by_le: dict[float, list[tuple[dict[str, str], np.ndarray]]] = defaultdict(list)
        for lb, v in exposed.select(f"{src.metric}_bucket", matchers):
            by_le[float(lb["le"])].append((lb, v))
        if not by_le or np.inf not in by_le:
            return None
        bounds = sorted(b for b in by_le if b != np.inf)
        cum = np.column_stack([_summed(by_le[b]) for b in (*bounds, np.inf)])
        out = histogram_quantile(src.quantile, bounds, cum, t, latency_window)
    elif k is SourceKind.HIST_MEAN:
        total = _summed(exposed.select(f"{src.metric}_sum", matchers))
        count = _summed(exposed.select(f"{src.metric}_count", matchers))
        if total is None or count is None:
            return None
        out = histogram_mean(total, count, t, latency_window)
    elif k is SourceKind.VLLM_CACHE_INFO:
        tokens = [cache_info_tokens(lb) for lb in exposed.labels(src.metric)]
        known = [x for x in tokens if x is not None]
        # vLLM states its pool only in labels, and not in every version
        return np.full(len(t), max(known)) if known else None
    else:
        return None
    return None if out is None else out * src.scale


def expr_fallback(sig: Signal, run: TargetRun, rate_window: float) -> np.ndarray | None:
    """What the dialects' ``EXPR`` sources compute, read from ground truth: capacity
    (blocks x block size, or used tokens / usage) is the pool size; waiting (queued plus
    active-but-unscheduled) and running are the engine's counts; Triton's queue mean is
    queue-time over successes."""
    tr = run.traces[0]
    t = np.asarray(run.wall_times, dtype=float)
    view = tr.view(t)
    if sig is Signal.KV_CAPACITY_TOKENS:
        return np.full(len(t), float(tr.config.kv_tokens))
    if sig is Signal.WAITING:
        return np.asarray(view.g["waiting"], dtype=float)
    if sig is Signal.RUNNING:  # SGLang: max over the scheduler ranks, summed over replicas
        return np.asarray(view.g["running"], dtype=float)
    if sig is Signal.PREEMPTIONS:  # TensorRT-LLM: paused per iteration x iterations/s
        return rate(np.asarray(view.c["preemptions"], dtype=float), t, rate_window)
    if sig is Signal.ABORT_RATE:  # trtllm-serve: cancelled/timeout finishes + errors
        return rate(np.asarray(view.c["aborted"], dtype=float), t, rate_window)
    if sig is Signal.QUEUE_MEAN:
        done = np.asarray(view.c["success_stop"], dtype=float) + np.asarray(view.c["success_length"], dtype=float)
        return histogram_mean(np.asarray(view.c["queue_us"], dtype=float) / 1e6, done, t, rate_window)
    return None
