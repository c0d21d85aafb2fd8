"""PromQL for dashboards and recording rules, rendered from the engine-dialect table.

Every engine-neutral expression here is built by iterating
:data:`kvwatch.core.dialects.DIALECTS` and calling ``Source.promql``: one
sub-expression per distinct dialect (a dialect's sources joined with ``or`` in
its preference order, so a renamed metric falls back to the old name), and the
dialects joined with ``or``. Different dialects use different metric names, so
the ``or`` never merges two engines' series; each result carries exactly the
target labels ``job`` and ``instance``. No metric name is written here: names
live in :mod:`kvwatch.core.dialects` and, for the few dashboard-only families, in
:mod:`kvwatch.core.extras`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from kvwatch.config import EvaluationSettings
from kvwatch.core.diagnose.prefill import MIN_HELD, PREFILL_SD
from kvwatch.core.dialects import BY, DIALECTS, Dialect, Source, SourceKind, selector
from kvwatch.core.extras import Extra, dialects_with, extra_sources
from kvwatch.core.signals import Signal

#: Matchers every dashboard query carries (Grafana template variables).
PANEL_MATCHERS = 'job=~"$job", instance=~"$instance"'
#: Grafana's rate window: at least four scrape intervals, follows the zoom level.
PANEL_RATE = "$__rate_interval"
#: Rate window of the recording rules (same default as kvwatch's ``evaluation.rate_window``).
RULE_RATE = "2m"
#: the TTFT SLO, s, of the native rules: kvwatch's default ``evaluation.ttft_slo`` (a Prometheus
#: rule file has no configuration to read it from)
NATIVE_TTFT_SLO_S = float(EvaluationSettings.model_fields["ttft_slo"].default)

#: Kinds that produce a number per target (``vllm:cache_config_info`` carries its numbers in labels).
_NUMERIC = frozenset(k for k in SourceKind if k is not SourceKind.VLLM_CACHE_INFO)


def _paren(q: str) -> str:
    return f"({q})"


def join_or(exprs: Iterable[str]) -> str:
    """``(a) or (b) …`` of distinct expressions, first occurrence order; ``""`` when empty."""
    seen: list[str] = []
    for e in exprs:
        if e and e not in seen:
            seen.append(e)
    if len(seen) == 1:
        return seen[0]
    return " or ".join(_paren(e) for e in seen)


def numeric_sources(dialect: Dialect, signal: Signal) -> tuple[Source, ...]:
    """The dialect's sources for ``signal`` that yield a value (not label-only info series)."""
    return tuple(s for s in dialect.sources.get(signal, ()) if s.kind in _NUMERIC)


def with_quantile(src: Source, q: float | None) -> Source:
    """``src`` with another quantile when it is a histogram quantile; other kinds unchanged."""
    if q is None or src.kind is not SourceKind.HIST_QUANTILE:
        return src
    return replace(src, quantile=q)


def dialect_expr(
    dialect: Dialect, signal: Signal, matchers: str, rate_window: str, quantile: float | None = None
) -> str:
    """One dialect's expression for ``signal`` (its sources in preference order, ``or``-ed)."""
    srcs = numeric_sources(dialect, signal)
    expr = join_or(with_quantile(s, quantile).promql(matchers, rate_window) for s in srcs)
    if expr and signal is Signal.WAITING and all(s.counts_prefill for s in srcs):
        expr = admission_queue_expr(expr, dialect_expr(dialect, Signal.REQUEST_RATE, matchers, rate_window))
    return deferred(dialect, expr, matchers)


def admission_queue_expr(queued: str, request_rate: str) -> str:
    """The admission queue behind a queue gauge that also counts requests in prefill, as
    kvwatch's diagnosis reads it (:mod:`kvwatch.core.diagnose.prefill`): what a prefill within
    :data:`NATIVE_TTFT_SLO_S` cannot hold, ``max(0, queued − max(1, m + 2·√m))`` with
    ``m = request_rate × SLO``. Where the rate has no value (no counter yet, a gap), one
    request before its first token is taken off."""
    q = f"({queued})"
    fallback = f"clamp_min({q} - {MIN_HELD:g}, 0)"
    if not request_rate:
        return fallback
    m = f"(({request_rate}) * {NATIVE_TTFT_SLO_S:g})"
    return f"clamp_min({q} - on ({BY}) clamp_min({m} + {PREFILL_SD:g} * sqrt({m}), {MIN_HELD:g}), 0) or {fallback}"


def deferred(dialect: Dialect, expr: str, matchers: str = "") -> str:
    """``expr`` without the targets that also speak an engine ``dialect`` defers to.

    A Dynamo worker that re-exports vLLM's metrics is a vLLM target: its Dynamo
    series must not add a second copy of it to dashboards and recording rules.
    """
    if not expr or not dialect.defer_to:
        return expr
    natives = [sel for d in DIALECTS if d.engine in dialect.defer_to for sel in identity_selectors(d, matchers)]
    guard = " or ".join(f"group by ({BY}) ({sel})" for sel in dict.fromkeys(natives))
    return f"({expr}) unless on ({BY}) ({guard})"


def signal_expr(
    signal: Signal,
    matchers: str = PANEL_MATCHERS,
    rate_window: str = PANEL_RATE,
    quantile: float | None = None,
    dialects: Iterable[Dialect] = DIALECTS,
) -> str:
    """Engine-neutral expression for ``signal``: one series per target of every dialect exporting it.

    ``quantile`` re-targets histogram-quantile sources (e.g. p95 from the p99 source).
    """
    return join_or(dialect_expr(d, signal, matchers, rate_window, quantile) for d in dialects)


def proxied(signal: Signal, proxy: bool = True) -> tuple[Dialect, ...]:
    """Dialects whose ``signal`` is (``proxy``) or is not an approximation of it (e.g. TGI's KV usage)."""
    return tuple(d for d in DIALECTS if d.sources.get(signal) and any(s.proxy for s in d.sources[signal]) == proxy)


def engines() -> tuple[str, ...]:
    """Engine families in dialect order (``vllm``, ``sglang``, ``trtllm``)."""
    out: list[str] = []
    for d in DIALECTS:
        if d.engine not in out:
            out.append(d.engine)
    return tuple(out)


def dialects_of(engine: str) -> tuple[Dialect, ...]:
    return tuple(d for d in DIALECTS if d.engine == engine)


#: Signals tried in order to recognise a target of a dialect (the first one the dialect has).
_IDENTITY_SIGNALS = (Signal.KV_USAGE, Signal.RUNNING, Signal.REQUEST_RATE)


def identity_selectors(dialect: Dialect, matchers: str = "") -> tuple[str, ...]:
    """Selectors of series that identify a target of ``dialect`` (histograms by ``_count``)."""
    for sig in _IDENTITY_SIGNALS:
        srcs = numeric_sources(dialect, sig)
        if srcs:
            out = []
            for s in srcs:
                req = s.requires[0]
                extra = s.matchers
                need = f'{dialect.required_label}!=""'
                if dialect.required_label and need not in extra:
                    extra = ", ".join(p for p in (extra, need) if p)
                if dialect.model_pattern:  # Triton core metrics: only the LLM model is the target
                    extra = ", ".join(p for p in (extra, f'model=~"{dialect.model_pattern}"') if p)
                out.append(selector(req, extra, matchers))
            return tuple(dict.fromkeys(out))
    raise ValueError(f"dialect {dialect.id} has none of {_IDENTITY_SIGNALS}")


def info_expr(engine: str, matchers: str = "") -> str:
    """Value-1 series per target of ``engine`` with labels job, instance, namespace, model.

    ``model`` is the engine's ``model_name`` label when set (vLLM, SGLang,
    trtllm-serve) and the Triton ``model`` label otherwise.
    """
    parts = []
    for d in dialects_of(engine):
        for sel in identity_selectors(d, matchers):
            relabelled = f'label_replace({sel}, "model", "$1", "model_name", "(.+)")'
            parts.append(deferred(d, f"group by ({BY}, namespace, model) ({relabelled})", matchers))
    return join_or(parts)


def extra_expr(extra: Extra, matchers: str = PANEL_MATCHERS, rate_window: str = PANEL_RATE) -> str:
    """Per-target expression of a dashboard-only family over every dialect that has it."""
    return join_or(
        deferred(d, join_or(s.promql(matchers, rate_window) for s in extra_sources(d, extra)), matchers)
        for d in dialects_with(extra)
    )


def _hit_ratio_expr(
    hit: Extra, asked: Extra, matchers: str, rate_window: str, dialects: Iterable[Dialect] | None = None
) -> str:
    """Per target ``(hit) / (asked)`` over the window, for every dialect with ``hit`` (or ``dialects``).

    Counters over the window, never a lifetime or last-batch gauge; a window in which
    nothing was asked yields no value (0/0), not 0 %.
    """
    parts = []
    for d in dialects_with(hit) if dialects is None else dialects:
        hits = join_or(s.promql(matchers, rate_window) for s in extra_sources(d, hit))
        total = join_or(s.promql(matchers, rate_window) for s in extra_sources(d, asked))
        parts.append(f"({hits}) / ({total})")
    return join_or(parts)


def prefix_hit_ratio_expr(
    matchers: str = PANEL_MATCHERS, rate_window: str = PANEL_RATE, dialects: Iterable[Dialect] | None = None
) -> str:
    """Windowed prefix-cache hit ratio (0-1) per target: hit tokens / looked-up tokens.

    Computed from counters over the window, never from a lifetime or last-batch gauge.
    A window without prompt traffic yields no value (0/0), not 0 %.
    """
    return _hit_ratio_expr(Extra.PREFIX_HIT_TOKENS, Extra.PREFIX_QUERY_TOKENS, matchers, rate_window, dialects)


def external_hit_ratio_expr(matchers: str = PANEL_MATCHERS, rate_window: str = PANEL_RATE) -> str:
    """Windowed hit ratio (0-1) of the external KV tier (a KV connector such as LMCache) per target."""
    return _hit_ratio_expr(Extra.EXTERNAL_HIT_TOKENS, Extra.EXTERNAL_QUERY_TOKENS, matchers, rate_window)


def lmcache_hit_ratio_expr(matchers: str = PANEL_MATCHERS, rate_window: str = PANEL_RATE) -> str:
    """Windowed share (0-1) of the tokens asked of LMCache that it served, per target."""
    return _hit_ratio_expr(Extra.LMCACHE_HIT_TOKENS, Extra.LMCACHE_REQUESTED_TOKENS, matchers, rate_window)


#: Gateway API inference extension (llm-d / GKE Inference Gateway) pool gauges, exported by the EPP
#: (kubernetes-sigs/gateway-api-inference-extension): labels ``name`` (the InferencePool).
POOL_KV = "inference_pool_average_kv_cache_utilization"
POOL_QUEUE = "inference_pool_average_queue_size"


def prefix_saved_tokens_expr(matchers: str = PANEL_MATCHERS, rate_window: str = PANEL_RATE) -> str:
    """Prompt tokens per second served from the prefix cache, per target: hit ratio x prompt tokens/s.

    Not the raw hit counter: vLLM 0.7.3-0.8.5 counts ``gpu_prefix_cache_hits`` in blocks
    (0.9.0+ in tokens, same name), so only the unit-free ratio compares across versions.
    """
    ratio = prefix_hit_ratio_expr(matchers, rate_window)
    prompt = signal_expr(Signal.PROMPT_TPS, matchers, rate_window)
    return f"({ratio}) * on ({BY}) ({prompt})"


def bucket_increase_exprs(
    extra: Extra, matchers: str = PANEL_MATCHERS, rate_window: str = PANEL_RATE
) -> tuple[str, ...]:
    """``sum by (le) (increase(<hist>_bucket[w]))`` per distinct histogram: heatmap rows.

    One expression per engine family because bucket boundaries differ between engines.
    """
    out: list[str] = []
    for d in dialects_with(extra):
        for s in extra_sources(d, extra):
            sel = selector(f"{s.metric}_bucket", s.matchers, matchers)
            q = f"sum by (le) (increase({sel}[{rate_window}]))"
            if q not in out:
                out.append(q)
    return tuple(out)
