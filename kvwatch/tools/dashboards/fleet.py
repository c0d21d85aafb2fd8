"""The KV fleet overview dashboard (uid ``kvwatch-fleet``)."""

from __future__ import annotations

from kvwatch.core.dialects import DIALECTS, SourceKind
from kvwatch.core.extras import Extra
from kvwatch.core.signals import Signal
from kvwatch.tools.dashboards import common as c
from kvwatch.tools.dashboards.grafana import Dashboard, Panel, PanelType, Target, row
from kvwatch.tools.dashboards.queries import (
    PANEL_MATCHERS,
    POOL_KV,
    POOL_QUEUE,
    extra_expr,
    signal_expr,
)
from kvwatch.tools.dashboards.recording import INFO_RECORD

_MODEL_INFO = f'max by (job, instance, model) ({INFO_RECORD}{{job=~"$job", instance=~"$instance"}})'


def _by_model(expr: str, agg: str) -> str:
    """``agg by (model)`` of a per-target expression, joining ``model`` from kvwatch's info series."""
    return f"{agg} by (model) (({expr}) * on (job, instance) group_left (model) {_MODEL_INFO})"


def _vllm_cache_info() -> str:
    srcs = {
        s.promql(PANEL_MATCHERS, "")
        for d in DIALECTS
        for s in d.sources.get(Signal.KV_CAPACITY_TOKENS, ())
        if s.kind is SourceKind.VLLM_CACHE_INFO
    }
    return " or ".join(sorted(srcs))


def verdict_panels() -> tuple[Panel, ...]:
    return (
        Panel(
            "Targets by kvwatch state",
            PanelType.STAT,
            "How many engine instances kvwatch currently puts in each state (kvwatch self-metric). "
            "'unknown' means a required signal is missing: a blind spot, not a healthy target.",
            (Target("sum by (state) (kvwatch_targets)", "{{state}}", instant=True),),
            width=8,
        ),
        Panel(
            "Target states",
            PanelType.TABLE,
            "One row per engine instance with the state kvwatch assigned at its last cycle. Click an instance "
            "in the KV usage panel to open its drilldown with kvwatch's diagnoses as annotations.",
            (
                Target(
                    'max by (job, instance, model, engine, state) (kvwatch_target_state{job=~"$job", instance=~"$instance"}) == 1',
                    instant=True,
                    fmt="table",
                ),
            ),
            width=16,
        ),
    )


def kv_panels() -> tuple[Panel, ...]:
    kv = signal_expr(Signal.KV_USAGE)
    cap = signal_expr(Signal.KV_CAPACITY_TOKENS)
    return (
        c.kv_usage_panel(),
        Panel(
            "Pool average from the inference gateway (cross-check)",
            PanelType.TIMESERIES,
            "Where an llm-d / Gateway API inference extension EPP routes the traffic, its pool-level averages "
            "(inference_pool_average_kv_cache_utilization, _queue_size) next to kvwatch's per-model mean: the "
            "gateway averages the same replicas, so a large gap means the EPP scrapes other pods than Prometheus "
            "(e.g. llm-d-inference-sim pods, which export vLLM names with simulated values). An average never "
            "shows the one pinned replica: read the replica-imbalance panel for that.",
            (
                Target(f"max by (name) ({POOL_KV})", "pool {{name}} KV (gateway)"),
                Target(f"max by (name) ({POOL_QUEUE})", "pool {{name}} queue (gateway)"),
                Target(_by_model(kv, "avg"), "{{model}} mean KV (kvwatch)"),
            ),
            min=0,
        ),
        Panel(
            "KV usage per model: max and mean",
            PanelType.TIMESERIES,
            "Per model, the most loaded replica (max) next to the replica mean. Never read the mean alone: a "
            "fleet mean of 50 % can hide one replica pinned at 100 % with a queue (the 'misread' mode).",
            (Target(_by_model(kv, "max"), "{{model}} max"), Target(_by_model(kv, "avg"), "{{model}} mean")),
            unit="percentunit",
            min=0,
            max=1,
        ),
        Panel(
            "Replica imbalance (max - mean KV usage per model)",
            PanelType.TIMESERIES,
            "How far the busiest replica of each model runs above the model's mean usage. Above ~0.3 for a "
            "sustained period the load balancer concentrates traffic (session affinity, prefix-aware routing, one "
            "tenant): rebalance routing before adding capacity.",
            (Target(f"{_by_model(kv, 'max')} - {_by_model(kv, 'avg')}", "{{model}}"),),
            unit="percentunit",
            min=0,
            thresholds=((0.3, "orange"),),
        ),
        Panel(
            "KV tokens used / free",
            PanelType.TIMESERIES,
            "KV usage translated into tokens with the pool size the engine reports: free tokens is the headroom "
            "for new requests (divide by the typical prompt+output length for requests of headroom). vLLM reports "
            "its capacity only as labels - see the cache-config table.",
            (
                Target(f"({kv}) * on (job, instance) ({cap})", "{{instance}} used"),
                Target(f"(1 - ({kv})) * on (job, instance) ({cap})", "{{instance}} free"),
            ),
            unit="short",
            min=0,
        ),
        Panel(
            "KV capacity (tokens and blocks)",
            PanelType.TABLE,
            "Pool size per instance: tokens, and blocks where the engine exports block counts. Capacity "
            "changes only on restart/reconfiguration; compare it with max context x max concurrency "
            "(`kvwatch capacity`).",
            (
                Target(cap, instant=True, fmt="table"),
                Target(extra_expr(Extra.KV_TOTAL_BLOCKS), instant=True, fmt="table"),
            ),
            width=12,
        ),
        Panel(
            "vLLM cache config (capacity labels)",
            PanelType.TABLE,
            "vLLM publishes its pool as labels of vllm:cache_config_info: num_gpu_blocks x block_size tokens "
            "(kv_cache_size_tokens from 0.24, correct for hybrid models). 'None' values come from old V1 builds.",
            (Target(_vllm_cache_info(), instant=True, fmt="table"),),
            width=12,
        ),
        Panel(
            "KV blocks used / free",
            PanelType.TIMESERIES,
            "Block counts where the engine exports them (TensorRT-LLM). Free blocks while requests wait or get "
            "paused point at fragmentation or reservation policy, not capacity.",
            (
                Target(extra_expr(Extra.KV_USED_BLOCKS), "{{instance}} used"),
                Target(extra_expr(Extra.KV_FREE_BLOCKS), "{{instance}} free"),
            ),
            min=0,
        ),
        c.preemption_panel(),
    )


def build() -> Dashboard:
    panels = (
        row("kvwatch verdicts"),
        *verdict_panels(),
        row("KV cache"),
        *kv_panels(),
        row("Scheduler and latency"),
        c.scheduler_panel(),
        c.queue_panel(),
        c.ttft_panel(),
        c.itl_panel(),
        c.tokens_panel(),
        c.requests_panel(),
        row("Prefix reuse and traffic shape"),
        *c.prefix_panels(),
        c.offload_panel(),
        c.length_heatmap(Extra.PROMPT_LENGTH, "Prompt length distribution (tokens)"),
        c.length_heatmap(Extra.OUTPUT_LENGTH, "Output length distribution (tokens)"),
    )
    return Dashboard(
        uid=c.FLEET_UID,
        title="kvwatch / KV fleet overview",
        description="KV cache, scheduler and latency signals of every LLM engine instance (vLLM, SGLang, "
        "TensorRT-LLM), engine-neutral, with kvwatch's verdicts. Needs kvwatch's recording rules "
        "(rules/prometheus) for the template variables.",
        panels=panels,
        variables=c.target_variables(),
        links=c.dashboard_links(c.FLEET_UID),
    )

