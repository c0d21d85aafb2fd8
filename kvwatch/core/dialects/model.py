"""The dialect model: sources (how PromQL yields one signal), dialects, and rendering.

Every query aggregates ``by (job, instance)``: one series per target, whatever
the data-parallel (``engine``, ``dp_rank``) or process (``pid``) labels are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from kvwatch.core.signals import Signal

#: The labels that identify a target. Every query groups by exactly these.
TARGET_LABELS: tuple[str, ...] = ("job", "instance")
BY = ", ".join(TARGET_LABELS)


def selector(metric: str, *matchers: str) -> str:
    """``metric{m1, m2}`` from non-empty matcher strings (each without braces)."""
    parts = [m for m in matchers if m]
    return f"{metric}{{{', '.join(parts)}}}"


class SourceKind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HIST_QUANTILE = "histogram_quantile"
    HIST_MEAN = "histogram_mean"
    EXPR = "expr"
    VLLM_CACHE_INFO = "vllm_cache_info"


#: Labels that identify one Triton model's series; core metrics are matched on them.
TRITON_MODEL_LABELS = ("model", "version")
#: The series that mark a Triton model as the TensorRT-LLM one (only that backend exports it).
TRITON_LLM_MARKER = "nv_trt_llm_request_metrics"


#: seconds a sample may trail its target's newest one and still come from the same scrape
#: (one scrape stamps all its samples alike; the next one is >= one interval later)
SAME_SCRAPE_S = 5


def per_target_ratio(num: str, den: str) -> str:
    """``num`` over ``den``, each summed per target first (one value per job and instance;
    0/0 gives NaN, which collection drops)."""
    return f"sum by ({BY}) ({num}) / sum by ({BY}) ({den})"


def newest_scrape(vector: str) -> str:
    """The instant gauge ``vector`` without leftovers of series the target no longer writes.

    A relabelled series (a pod hash or version label after a rollout) replaces the old one.
    A live Prometheus marks the old one stale at the next scrape, but backfilled, imported or
    federated data may carry no staleness markers: the old series' last value then stays
    visible for the 5-minute lookback next to the new one, and a ``sum``/``max`` over the
    target counts both (running doubled, a KV value frozen). Per target and step this keeps
    the series stamped within :data:`SAME_SCRAPE_S` of the target's newest sample
    (data-parallel engines of one endpoint share its scrape). It costs a join per step, so
    kvwatch uses it only for targets :mod:`kvwatch.core.churn` found with leftovers."""
    ts = f"timestamp({vector})"
    return f"({vector} and ({ts} >= on ({BY}) group_left max by ({BY}) ({ts}) - {SAME_SCRAPE_S}))"


@dataclass(frozen=True)
class Render:
    """What a source needs besides its own fields to render PromQL.

    ``user`` are the user's matchers (without braces), ``rw`` the window,
    ``triton_model`` a regex of the Triton model name(s) holding the LLM (empty:
    the models that export ``nv_trt_llm_*``, found by a join).
    """

    user: str
    rw: str
    triton_model: str = ""
    fresh: bool = False  # instant gauge selectors through newest_scrape

    def sel(self, metric: str, extra: str = "") -> str:
        return selector(metric, extra, self.user)

    def gauge(self, metric: str, extra: str = "") -> str:
        """An instant gauge selector, through :func:`newest_scrape` where ``fresh`` is on."""
        return self.fresh_gauge(self.sel(metric, extra))

    def fresh_gauge(self, selector: str) -> str:
        return newest_scrape(selector) if self.fresh else selector

    def llm(self, vector: str, scoped: bool = True) -> str:
        """``vector`` restricted to the Triton LLM model (identity when ``scoped`` is false).

        With an explicit ``triton_model`` the selectors already carry the model
        matcher; otherwise keep only series of a (model, version) that also exports
        the TensorRT-LLM backend's own metrics, so ensemble/pre/post-processing
        models never mix into sums, maxima or ratios.
        """
        if not scoped or self.triton_model:
            return vector
        on = ", ".join((*TARGET_LABELS, *TRITON_MODEL_LABELS))
        return f"({vector} and on ({on}) group by ({on}) ({self.sel(TRITON_LLM_MARKER)}))"


@dataclass(frozen=True)
class Source:
    """One way to compute a signal from an engine's metrics.

    ``metric`` is the scraped family name (histograms: without ``_bucket``);
    ``matchers`` are extra label matchers (without braces); ``agg`` is the
    cross-series aggregation (``max`` for ratios and per-model duplicates,
    ``sum`` for counts over data-parallel engines); ``dedup_by`` first collapses
    duplicate series with ``max`` keeping those labels (SGLang exports the same
    scheduler state once per tensor-parallel rank: ``max by (dp_rank)`` then
    ``sum``); ``scale`` converts units (e.g. ms → s). ``EXPR`` sources build their
    PromQL with ``expr(r)`` from a :class:`Render`.

    ``lazy_anchor``: the engine creates this counter's series only at its first
    event; the source then requires the always-present ``lazy_anchor`` metric
    instead, and an absent counter reads 0 (so the source choice never flips
    when the first event happens). ``triton_core``: a Triton core metric
    (``nv_inference_*``) carried by every model of the server; it is restricted
    to the LLM model. ``bucket_range``: the default lowest and highest finite
    histogram bounds in the signal's unit (a quantile outside is interpolation
    or saturation, not measurement). ``note``: meaning and caveats (docs/engines.md).
    ``proxy``: non-empty when the source only approximates the signal (what it really
    measures); everything that shows the value says so. ``counts_prefill`` (a waiting
    gauge): it also counts requests being prefilled, until their first token, so Little's
    law puts request rate × TTFT in it with nobody queued (:mod:`kvwatch.core.diagnose.prefill`).
    """

    kind: SourceKind
    metric: str
    matchers: str = ""
    agg: str = "max"
    quantile: float = 0.0
    scale: float = 1.0
    expr: Callable[[Render], str] | None = None
    extra_requires: tuple[str, ...] = ()
    dedup_by: tuple[str, ...] = ()
    lazy_anchor: str = ""
    triton_core: bool = False
    bucket_range: tuple[float, float] | None = None
    note: str = ""
    proxy: str = ""
    counts_prefill: bool = False
    #: for a finished-requests counter: whether aborted (cancelled, failed) requests count as
    #: finished in it (vLLM's ``request_success_total{finished_reason="abort"}``), so progress is
    #: this rate minus the abort rate; False where the counter holds successes only (TGI's
    #: ``tgi_request_success``, Triton's ``nv_inference_request_success``: failures counted apart)
    counts_aborted: bool = True
    #: for a fallback: how it yields the signal in the signal's one unit (e.g. tokens/s from
    #: decode requests per iteration x iterations per second); shown by explain/check
    estimate: str = ""
    #: for a queue reading: it does not count requests the engine admitted but does not schedule
    #: (an executor queue alone), so a wedged scheduler holding its requests admitted reads 0 in it
    misses_admitted: bool = False
    #: for a token counter: the engine adds a request's tokens when the request finishes, not
    #: per step (SGLang's ``generation_tokens_total``, per-request histogram sums), so a zero rate
    #: says only that no request finished in the rate window, as a request counter would
    counted_at_finish: bool = False
    #: for a running gauge: the engine reads it after the step's finished requests left the
    #: batch (vLLM: V1 ``update_from_output`` removes them, then ``make_stats``; V0 frees finished
    #: groups before logging; SGLang logs the decode batch filtered of the previous step's finished
    #: requests, or the running batch before a prefill refills it), so a batch held at its cap
    #: reads the cap less the requests that finished in a step (exactly the cap with probability
    #: e^-λ, λ completions per step)
    after_finishes: bool = False

    @property
    def requires(self) -> tuple[str, ...]:
        """Metric names that must be present on a target for this source to apply."""
        base = self.lazy_anchor or self.metric
        if not self.lazy_anchor and self.kind in (SourceKind.HIST_QUANTILE, SourceKind.HIST_MEAN):
            base = f"{self.metric}_count"
        return (base, *self.extra_requires)

    @property
    def family_names(self) -> tuple[str, ...]:
        """Every engine family this source reads (histograms by family name)."""
        return tuple(dict.fromkeys((self.metric, *([self.lazy_anchor] if self.lazy_anchor else []),
                                    *self.extra_requires)))

    def _sel(self, suffix: str, r: Render) -> str:
        extra = self.matchers
        if self.triton_core and r.triton_model:
            extra = ", ".join(m for m in (extra, f'model=~"{r.triton_model}"') if m)
        return selector(f"{self.metric}{suffix}", extra, r.user)

    def _aggregate(self, inner: str) -> str:
        if self.dedup_by:
            inner = f"max by ({BY}, {', '.join(self.dedup_by)}) ({inner})"
        return f"{self.agg} by ({BY}) ({inner})"

    def promql(
        self, user_matchers: str, rate_window: str, latency_window: str | None = None, triton_model: str = "",
        *, fresh: bool = False,
    ) -> str:
        """Render the PromQL that yields this signal for every target at once.

        Histogram quantiles and means use ``latency_window`` when given (a stable tail
        needs more requests than a short rate window holds), counters ``rate_window``.
        ``triton_model``: regex of the Triton LLM model (empty: found by a join).
        ``fresh``: gauges without leftovers of relabelled series (:func:`newest_scrape`).
        """
        k = self.kind
        if latency_window and k in (SourceKind.HIST_QUANTILE, SourceKind.HIST_MEAN):
            rate_window = latency_window
        r = Render(user_matchers, rate_window, triton_model, fresh)
        scoped = self.triton_core
        if k is SourceKind.GAUGE:
            q = self._aggregate(r.llm(r.fresh_gauge(self._sel("", r)), scoped))
        elif k is SourceKind.COUNTER:
            q = self._aggregate(r.llm(f"rate({self._sel('', r)}[{rate_window}])", scoped))
        elif k is SourceKind.HIST_QUANTILE:
            q = f"histogram_quantile({self.quantile}, {self._bucket_rates(r, rate_window)})"
        elif k is SourceKind.HIST_MEAN:
            # numerator and denominator over the same series (same model, same filter)
            num, den = (r.llm(f"rate({self._sel(sfx, r)}[{rate_window}])", scoped) for sfx in ("_sum", "_count"))
            q = per_target_ratio(num, den)
        elif k is SourceKind.VLLM_CACHE_INFO:
            # per engine: with data parallelism every engine core has its own pool
            labels = "engine, num_gpu_blocks, block_size, kv_cache_size_tokens"
            q = f"max by ({BY}, {labels}) ({self._sel('', r)})"
        else:
            assert self.expr is not None, f"EXPR source {self.metric} without expr"
            q = self.expr(r)
        if self.scale != 1.0 and k is not SourceKind.VLLM_CACHE_INFO:
            q = f"({q}) * {self.scale!r}"
        if self.lazy_anchor:
            q = f"({q}) or (0 * group by ({BY}) ({selector(self.lazy_anchor, '', user_matchers)}))"
        return q

    def _bucket_rates(self, r: Render, rate_window: str) -> str:
        inner = r.llm(f"rate({self._sel('_bucket', r)}[{rate_window}])", self.triton_core)
        return f"sum by ({BY}, le) ({inner})"

    def bucket_promql(
        self, user_matchers: str, rate_window: str, latency_window: str | None = None, triton_model: str = ""
    ) -> str | None:
        """The per-target bucket rates a ``HIST_QUANTILE`` source takes its quantile of
        (the argument of its ``histogram_quantile``, unscaled); None for other sources and for
        a lazily anchored one (its ``or`` is not a bucket vector)."""
        if self.kind is not SourceKind.HIST_QUANTILE or self.lazy_anchor:
            return None
        return self._bucket_rates(Render(user_matchers, latency_window or rate_window, triton_model), latency_window or rate_window)


@dataclass(frozen=True)
class Dialect:
    """A family of metric names: its id, engine, how to recognise it, and its sources.

    ``model_pattern``: the dialect applies only when a discovered ``model`` label
    fully matches this regex (Triton core metrics alone say nothing about the
    backend). ``blind_reason``: why a recognised target of this dialect cannot be
    diagnosed (shown instead of "kv_usage is not exported"). ``versions`` and
    ``upstream`` (file@commit or release) feed docs/engines.md. ``defer_to``: engines
    whose own metrics win when a target exports both (a Dynamo worker re-exporting
    vLLM's metrics is a vLLM target, counted once).
    """

    id: str
    engine: str
    markers: tuple[str, ...]
    sources: dict[Signal, tuple[Source, ...]] = field(default_factory=dict)
    required_label: str = ""
    model_pattern: str = ""
    blind_reason: str = ""
    versions: str = ""
    upstream: str = ""
    defer_to: tuple[str, ...] = ()

    def names(self) -> set[str]:
        out = set(self.markers)
        for srcs in self.sources.values():
            for s in srcs:
                out.update(s.requires)
        return out

