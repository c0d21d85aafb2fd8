"""Observed request lengths and the engine's KV pool, read from Prometheus.

Prompt and output lengths come from the engines' per-request token
histograms, one ``histogram_quantile(q, sum by (le) (rate(X_bucket[window])))``
query per quantile and histogram, summed over every series the selector
matches (a fleet-wide distribution). The pool size (tokens) comes from the
dialect's ``kv_capacity_tokens`` sources in :mod:`kvwatch.core.dialects`; with
several instances the smallest pool is used. Missing data is reported in
``notes``, never replaced by a guess.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kvwatch.core.collect import cache_info_tokens
from kvwatch.core.dialects import DIALECT_BY_ID, DIALECTS, SourceKind, selector
from kvwatch.core.extras import Extra, extra_sources
from kvwatch.core.promclient import QueryClient, Series
from kvwatch.core.selector import target_matchers
from kvwatch.core.signals import Signal
from kvwatch.tools.capacity.math import QUANTILES


@dataclass(frozen=True)
class LengthHistograms:
    """One engine's per-request prompt/output token histograms (family names, no ``_bucket``)."""

    engine: str
    dialect: str
    prompt: str
    output: str
    note: str = ""


#: caveats of an engine's length histograms, shown with the quantiles
_LENGTH_NOTES = {
    "vllm": "vLLM token histograms use 1-2-5 buckets: quantiles are interpolated and coarse",
    "trtllm-triton": "Triton nv_llm_* buckets end at 1000 tokens: quantiles above 1000 are clamped to 1000",
}


def _length_histograms() -> tuple[LengthHistograms, ...]:
    """Every dialect's length-histogram families, from the shared table in :mod:`kvwatch.core.extras`."""
    out: list[LengthHistograms] = []
    seen: set[str] = set()
    for d in DIALECTS:
        prompt, output = extra_sources(d, Extra.PROMPT_LENGTH), extra_sources(d, Extra.OUTPUT_LENGTH)
        if not prompt or not output or prompt[0].metric in seen:
            continue  # vLLM V0 and V1 share their names
        seen.add(prompt[0].metric)
        note = _LENGTH_NOTES.get(d.id, _LENGTH_NOTES.get(d.engine, ""))
        out.append(LengthHistograms(d.engine, d.id, prompt[0].metric, output[0].metric, note))
    return tuple(out)


#: Detection order: the first family present wins.
LENGTH_HISTOGRAMS: tuple[LengthHistograms, ...] = _length_histograms()


@dataclass(frozen=True)
class Observation:
    """What Prometheus says about real traffic: length quantiles (tokens) and pool size (tokens)."""

    url: str
    at: datetime
    window: str
    selector: str
    engine: str | None
    prompt: dict[float, int]
    output: dict[float, int]
    pool_tokens: int | None
    pool_detail: str
    notes: tuple[str, ...]
    queries: int

    def to_dict(self) -> dict[str, Any]:
        def labelled(d: dict[float, int]) -> dict[str, int]:
            return {f"p{round(q * 100)}": v for q, v in sorted(d.items())}

        return {
            "url": self.url,
            "at": self.at.isoformat().replace("+00:00", "Z"),
            "window": self.window,
            "selector": self.selector,
            "engine": self.engine,
            "prompt_tokens": labelled(self.prompt),
            "output_tokens": labelled(self.output),
            "pool_tokens": self.pool_tokens,
            "pool_detail": self.pool_detail,
            "queries": self.queries,
        }


def detection_query(user_matchers: str) -> str:
    """Which length histograms exist (by ``_count`` name) for the user's matchers."""
    names = "|".join(re.escape(f"{h.prompt}_count") for h in LENGTH_HISTOGRAMS)
    matcher = f'__name__=~"{names}"'
    return f"group by (__name__) ({selector('', matcher, user_matchers)})"


def quantile_query(family: str, q: float, user_matchers: str, window: str) -> str:
    """``histogram_quantile(q, sum by (le) (rate(family_bucket{...}[window])))``."""
    bucket = selector(f"{family}_bucket", user_matchers)
    return f"histogram_quantile({q}, sum by (le) (rate({bucket}[{window}])))"


def _value(row: Series) -> float | None:
    try:
        v = float(row["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v >= 0 else None


def observe(
    client: QueryClient, at: datetime, window: str, user_matchers: str, selector_text: str = ""
) -> Observation:
    """Read length quantiles and pool size at ``at`` over ``window`` (a PromQL duration)."""
    queries = 1
    present = {
        r.get("metric", {}).get("__name__")
        for r in client.instant(detection_query(user_matchers), at)
    }
    found = [h for h in LENGTH_HISTOGRAMS if f"{h.prompt}_count" in present]
    base = {"url": client.url, "at": at, "window": window, "selector": selector_text}
    if not found:
        note = f"no prompt/output length histograms at {client.url} for selector {selector_text or '{}'}"
        return Observation(
            **base,
            engine=None,
            prompt={},
            output={},
            pool_tokens=None,
            pool_detail="",
            notes=(note,),
            queries=queries,
        )
    hist, notes = found[0], [h for h in (found[0].note,) if h]
    if len(found) > 1:
        others = ", ".join(h.prompt for h in found[1:])
        notes.append(
            f"several engines match; used {hist.prompt} (also {others}): narrow with --selector"
        )
    lengths: dict[str, dict[float, int]] = {"prompt": {}, "output": {}}
    for kind, family in (("prompt", hist.prompt), ("output", hist.output)):
        for q in QUANTILES:
            rows = client.instant(quantile_query(family, q, user_matchers, window), at)
            queries += 1
            value = next((v for v in map(_value, rows) if v is not None), None)
            if value is None:
                notes.append(
                    f"{family}: no p{round(q * 100)} over {window} (no finished requests?)"
                )
            else:
                lengths[kind][q] = round(value)
    pool, detail, pool_notes, n = _pool(client, at, window, user_matchers, hist.dialect)
    if pool is None and user_matchers:
        pool, detail, pool_notes, n = _pool_of_matching_targets(client, at, window, user_matchers, hist, n)
    return Observation(
        **base,
        engine=hist.engine,
        prompt=lengths["prompt"],
        output=lengths["output"],
        pool_tokens=pool,
        pool_detail=detail,
        notes=(*notes, *pool_notes),
        queries=queries + n,
    )


#: targets whose pool is looked up one by one when the selector does not match the pool metric
MAX_JOINED_TARGETS = 20


def _pool_of_matching_targets(
    client: QueryClient, at: datetime, window: str, user_matchers: str, hist: Any, tried: int
) -> tuple[int | None, str, list[str], int]:
    """The pool of the targets whose length histograms match the selector.

    A selector such as ``{model_name="m"}`` matches the histograms but not every pool
    metric (``vllm:cache_config_info`` carries no ``model_name``): join on
    ``job``/``instance`` of the histogram series instead.
    """
    rows = client.instant(f"group by (job, instance) ({selector(hist.prompt + '_count', user_matchers)})", at)
    keys = sorted({(r.get("metric", {}).get("job", ""), r.get("metric", {}).get("instance", "")) for r in rows})
    queries = tried + 1
    pools: list[tuple[int, str]] = []
    notes: list[str] = []
    for job, instance in keys[:MAX_JOINED_TARGETS]:
        pool, detail, _, n = _pool(client, at, window, target_matchers(job, instance), hist.dialect)
        queries += n
        if pool is not None:
            pools.append((pool, detail))
    if len(keys) > MAX_JOINED_TARGETS:
        notes.append(f"pool read for the first {MAX_JOINED_TARGETS} of {len(keys)} matching targets")
    if not pools:
        return None, "", [f"no engine-reported KV pool size ({hist.dialect})"], queries
    smallest, detail = min(pools)
    if len({p for p, _ in pools}) > 1:
        notes.append(f"{len(pools)} instances report pools of {smallest:,}–{max(pools)[0]:,} tokens; used the smallest")
    return smallest, f"{detail}, joined on job/instance of the matching histograms", notes, queries


def _pool(
    client: QueryClient, at: datetime, window: str, user_matchers: str, dialect: str
) -> tuple[int | None, str, list[str], int]:
    """Smallest engine-reported pool (tokens) over matching instances; tries sources in order."""
    sources = DIALECT_BY_ID[dialect].sources.get(Signal.KV_CAPACITY_TOKENS, ())
    for n, src in enumerate(sources, 1):
        rows = client.instant(src.promql(user_matchers, window), at)
        pools: dict[str, int] = {}
        for row in rows:
            m = row.get("metric", {})
            tokens = (
                cache_info_tokens(m) if src.kind is SourceKind.VLLM_CACHE_INFO else _value(row)
            )
            if tokens:
                key = f"{m.get('job', '')}/{m.get('instance', '')}"
                pools[key] = min(pools.get(key, int(tokens)), int(tokens))
        if pools:
            smallest = min(pools.values())
            notes = []
            if len(set(pools.values())) > 1:
                notes.append(
                    f"{len(pools)} instances report pools of {smallest:,}–{max(pools.values()):,} "
                    "tokens; used the smallest"
                )
            return smallest, f"engine-reported pool ({src.metric})", notes, n
    return None, "", [f"no engine-reported KV pool size ({dialect})"], len(sources)
