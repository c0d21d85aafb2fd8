"""Engine dialects as data: which PromQL yields each canonical signal.

A *dialect* is one family of metric names (vLLM V1, vLLM V0, SGLang with ``sglang:``
or ``sglang_`` prefix, TensorRT-LLM under Triton, trtllm-serve). For every
canonical :class:`~kvwatch.core.signals.Signal` a dialect lists *sources* in order of
preference; per target the first source whose metric names Prometheus holds for
that target wins. This handles renames between engine versions
(``vllm:gpu_cache_usage_perc`` → ``vllm:kv_cache_usage_perc`` …) without a
version table. Names are as scraped (counters carry ``_total``); facts come from
``shared/engine-metrics.md``.

The package: ``model`` (sources, dialects, rendering), ``compose`` (building blocks of
source tables), one module per engine family (``vllm``, ``sglang``, ``trtllm``,
``lmdeploy``, ``tgi``, ``dynamo``) and ``table`` (the ordered table and lookups).
Everything public is re-exported here: ``from kvwatch.core.dialects import ...``.
"""

from __future__ import annotations

from kvwatch.core.dialects.model import (
    BY,
    TARGET_LABELS,
    TRITON_LLM_MARKER,
    TRITON_MODEL_LABELS,
    Dialect,
    Render,
    Source,
    SourceKind,
    selector,
)
from kvwatch.core.dialects.table import (
    DIALECT_BY_ID,
    DIALECTS,
    aborts_count_as_finished,
    all_names,
    kv_proxy,
    resolve,
    running_after_finishes,
    tokens_counted_at_finish,
    waiting_counts_prefill,
    waiting_is_estimate,
    waiting_shows_stalls,
)
from kvwatch.core.dialects.trtllm import TRITON_LLMAPI_BLIND, TRITON_LLMAPI_SOURCES, TRITON_SOURCES
from kvwatch.core.dialects.vllm import VLLM_SOURCES

__all__ = [
    "BY",
    "DIALECTS",
    "DIALECT_BY_ID",
    "TARGET_LABELS",
    "TRITON_LLMAPI_BLIND",
    "TRITON_LLMAPI_SOURCES",
    "TRITON_LLM_MARKER",
    "TRITON_MODEL_LABELS",
    "TRITON_SOURCES",
    "VLLM_SOURCES",
    "Dialect",
    "Render",
    "Source",
    "SourceKind",
    "aborts_count_as_finished",
    "all_names",
    "kv_proxy",
    "resolve",
    "running_after_finishes",
    "selector",
    "tokens_counted_at_finish",
    "waiting_counts_prefill",
    "waiting_is_estimate",
    "waiting_shows_stalls",
]
