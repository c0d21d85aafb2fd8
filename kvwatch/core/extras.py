"""Metric families beyond the canonical signals: the classifier does not need them.

Prefix-cache reuse, request-length histograms and KV block counts are shown on
the dashboards (and the length histograms feed ``kvwatch capacity``) but are not
canonical signals (adding them to
:mod:`kvwatch.core.dialects` would make every target report them as blind spots).
They are declared with the same :class:`~kvwatch.core.dialects.Source` model, and
their names are derived from the dialect table wherever the table already
fixes the prefix (``sglang:`` vs ``sglang_``, ``trtllm_``), so a rename there
carries over. Facts: ``shared/engine-metrics.md`` §1.2, §2, §3, §6.
"""

from __future__ import annotations

from enum import StrEnum

from kvwatch.core.dialects import DIALECT_BY_ID, DIALECTS, Dialect, Source, SourceKind
from kvwatch.core.signals import Signal

G, C = SourceKind.GAUGE, SourceKind.COUNTER


class Extra(StrEnum):
    """A dashboard-only family; units in the comment."""

    PREFIX_HIT_TOKENS = "prefix_hit_tokens"  # counter, tokens served from the prefix cache
    PREFIX_QUERY_TOKENS = "prefix_query_tokens"  # counter, prompt tokens looked up
    PROMPT_LENGTH = "prompt_length"  # histogram, prompt tokens per request
    OUTPUT_LENGTH = "output_length"  # histogram, output tokens per request
    KV_USED_BLOCKS = "kv_used_blocks"  # gauge, blocks
    KV_FREE_BLOCKS = "kv_free_blocks"  # gauge, blocks
    KV_TOTAL_BLOCKS = "kv_total_blocks"  # gauge, blocks
    EXTERNAL_HIT_TOKENS = "external_hit_tokens"  # counter, tokens found in a KV-connector cache (LMCache, NIXL)
    EXTERNAL_QUERY_TOKENS = "external_query_tokens"  # counter, tokens looked up there
    CACHED_PROMPT_TOKENS = "cached_prompt_tokens"  # counter, prompt tokens not computed (local + external)
    OFFLOAD_USAGE = "offload_usage"  # gauge, ratio 0-1 of the offload (CPU) KV tier in use
    LMCACHE_HIT_TOKENS = "lmcache_hit_tokens"  # counter, tokens LMCache served (inside vLLM)
    LMCACHE_REQUESTED_TOKENS = "lmcache_requested_tokens"  # counter, tokens asked of LMCache
    LMCACHE_LOCAL_BYTES = "lmcache_local_bytes"  # gauge, bytes of LMCache's local (CPU) tier in use


def _first(dialect_id: str, signal: Signal) -> Source:
    return DIALECT_BY_ID[dialect_id].sources[signal][0]


def _prefix(dialect_id: str) -> str:
    """Metric prefix of a dialect, read off its prompt-token counter (e.g. ``sglang_``)."""
    return _first(dialect_id, Signal.PROMPT_TPS).metric.removesuffix("prompt_tokens_total")


def _vllm() -> dict[Extra, tuple[Source, ...]]:
    p = _prefix("vllm-v1")
    vm = _first("vllm-v1", Signal.KV_USAGE).matchers  # model_name!="" keeps router look-alikes out
    return {
        # ≥0.9.2 names first, then the pre-0.12 gpu_ names (blocks ≤0.8.x, tokens ≥0.9.0)
        Extra.PREFIX_HIT_TOKENS: (
            Source(C, f"{p}prefix_cache_hits_total", vm, agg="sum"),
            Source(C, f"{p}gpu_prefix_cache_hits_total", vm, agg="sum"),
        ),
        Extra.PREFIX_QUERY_TOKENS: (
            Source(C, f"{p}prefix_cache_queries_total", vm, agg="sum"),
            Source(C, f"{p}gpu_prefix_cache_queries_total", vm, agg="sum"),
        ),
        Extra.PROMPT_LENGTH: (Source(SourceKind.HIST_MEAN, f"{p}request_prompt_tokens", vm),),
        Extra.OUTPUT_LENGTH: (Source(SourceKind.HIST_MEAN, f"{p}request_generation_tokens", vm),),
        # >= 0.11.2, only with a KV connector; >= 0.16; only with the CPU offloading connector
        Extra.EXTERNAL_HIT_TOKENS: (Source(C, f"{p}external_prefix_cache_hits_total", vm, agg="sum"),),
        Extra.EXTERNAL_QUERY_TOKENS: (Source(C, f"{p}external_prefix_cache_queries_total", vm, agg="sum"),),
        Extra.CACHED_PROMPT_TOKENS: (Source(C, f"{p}prompt_tokens_cached_total", vm, agg="sum"),),
        Extra.OFFLOAD_USAGE: (Source(G, f"{p}kv_offload_cpu_cache_usage_perc"),),
        # LMCache as vLLM's KV connector registers its own families on vLLM's /metrics
        # (LMCache/LMCache:lmcache/observability.py; labels model_name, worker_id, role)
        Extra.LMCACHE_HIT_TOKENS: (Source(C, "lmcache:num_hit_tokens_total", agg="sum"),),
        Extra.LMCACHE_REQUESTED_TOKENS: (Source(C, "lmcache:num_requested_tokens_total", agg="sum"),),
        Extra.LMCACHE_LOCAL_BYTES: (Source(G, "lmcache:local_cache_usage", agg="sum"),),
    }


def _vllm_ray(dialect_id: str) -> dict[Extra, tuple[Source, ...]]:
    p = _prefix(dialect_id)
    vm = _first(dialect_id, Signal.KV_USAGE).matchers
    return {
        Extra.PREFIX_HIT_TOKENS: (Source(C, f"{p}prefix_cache_hits_total", vm, agg="sum"),),
        Extra.PREFIX_QUERY_TOKENS: (Source(C, f"{p}prefix_cache_queries_total", vm, agg="sum"),),
        Extra.PROMPT_LENGTH: (Source(SourceKind.HIST_MEAN, f"{p}request_prompt_tokens", vm),),
        Extra.OUTPUT_LENGTH: (Source(SourceKind.HIST_MEAN, f"{p}request_generation_tokens", vm),),
    }


def _sglang(dialect_id: str) -> dict[Extra, tuple[Source, ...]]:
    p = _prefix(dialect_id)
    return {
        Extra.PREFIX_HIT_TOKENS: (Source(C, f"{p}cached_tokens_total", agg="sum"),),
        Extra.PREFIX_QUERY_TOKENS: (_first(dialect_id, Signal.PROMPT_TPS),),
        Extra.PROMPT_LENGTH: (Source(SourceKind.HIST_MEAN, f"{p}prompt_tokens_histogram"),),
        Extra.OUTPUT_LENGTH: (Source(SourceKind.HIST_MEAN, f"{p}generation_tokens_histogram"),),
    }


def _triton() -> dict[Extra, tuple[Source, ...]]:
    blocks = _first("trtllm-triton", Signal.KV_USAGE).metric
    prompt = _first("trtllm-triton", Signal.PROMPT_TPS).metric.removesuffix("_sum")
    output = _first("trtllm-triton", Signal.GEN_TPS).metric.removesuffix("_sum")
    return {
        Extra.PROMPT_LENGTH: (Source(SourceKind.HIST_MEAN, prompt),),
        Extra.OUTPUT_LENGTH: (Source(SourceKind.HIST_MEAN, output),),
        Extra.KV_USED_BLOCKS: (Source(G, blocks, 'kv_cache_block_type="used"'),),
        Extra.KV_FREE_BLOCKS: (Source(G, blocks, 'kv_cache_block_type="free"'),),
        Extra.KV_TOTAL_BLOCKS: (Source(G, blocks, 'kv_cache_block_type="max"'),),
    }


def _trtllm_serve() -> dict[Extra, tuple[Source, ...]]:
    p = _prefix("trtllm-serve")
    return {
        Extra.PREFIX_HIT_TOKENS: (Source(C, f"{p}prompt_cached_tokens_total", agg="sum"),),
        Extra.PREFIX_QUERY_TOKENS: (_first("trtllm-serve", Signal.PROMPT_TPS),),
        Extra.KV_USED_BLOCKS: (Source(G, f"{p}kv_cache_used_blocks"),),
        Extra.KV_FREE_BLOCKS: (Source(G, f"{p}kv_cache_free_blocks"),),
        Extra.KV_TOTAL_BLOCKS: (Source(G, f"{p}kv_cache_max_blocks"),),
    }


def _lmdeploy() -> dict[Extra, tuple[Source, ...]]:
    p = _prefix("lmdeploy")
    return {
        Extra.PREFIX_HIT_TOKENS: (Source(C, f"{p}cached_tokens_total", agg="sum"),),
        Extra.PREFIX_QUERY_TOKENS: (_first("lmdeploy", Signal.PROMPT_TPS),),
        Extra.PROMPT_LENGTH: (Source(SourceKind.HIST_MEAN, f"{p}request_prompt_tokens"),),
        Extra.OUTPUT_LENGTH: (Source(SourceKind.HIST_MEAN, f"{p}request_generation_tokens"),),
    }


def _dynamo() -> dict[Extra, tuple[Source, ...]]:
    return {Extra.KV_TOTAL_BLOCKS: (Source(G, "dynamo_component_kvstats_total_blocks", agg="sum"),)}


#: Per dialect id, the extra families it can export (absent key: not exported by that engine).
EXTRA_SOURCES: dict[str, dict[Extra, tuple[Source, ...]]] = {
    "vllm-v0": _vllm(),
    "vllm-v1": _vllm(),
    "vllm-ray": _vllm_ray("vllm-ray"),
    "sglang": _sglang("sglang"),
    "sglang-ray": _sglang("sglang-ray"),
    "lmdeploy": _lmdeploy(),
    "trtllm-triton": _triton(),
    "trtllm-serve": _trtllm_serve(),
    "dynamo-worker": _dynamo(),
}


def extra_sources(dialect: Dialect, extra: Extra) -> tuple[Source, ...]:
    return EXTRA_SOURCES.get(dialect.id, {}).get(extra, ())


def dialects_with(extra: Extra) -> tuple[Dialect, ...]:
    return tuple(d for d in DIALECTS if extra_sources(d, extra))
