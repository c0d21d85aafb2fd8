"""Template variables and signal panels shared by the fleet and instance dashboards.

Query text comes from :mod:`kvwatch.tools.dashboards.queries` (the dialect table);
this module only decides titles, units and how each panel is to be read.
"""

from __future__ import annotations

from kvwatch.core.extras import Extra
from kvwatch.core.signals import Signal
from kvwatch.tools.dashboards.grafana import Panel, PanelType, Target, Variable
from kvwatch.tools.dashboards.queries import (
    bucket_increase_exprs,
    external_hit_ratio_expr,
    extra_expr,
    lmcache_hit_ratio_expr,
    prefix_hit_ratio_expr,
    prefix_saved_tokens_expr,
    proxied,
    signal_expr,
)
from kvwatch.tools.dashboards.recording import INFO_RECORD

TS, TABLE, HEAT = PanelType.TIMESERIES, PanelType.TABLE, PanelType.HEATMAP
QUANTILES = (0.5, 0.95, 0.99)
INSTANCE_UID = "kvwatch-instance"
FLEET_UID = "kvwatch-fleet"
SELF_UID = "kvwatch-self"
#: Data link from any per-instance series to the drilldown, keeping the time range.
DRILLDOWN_LINK = {
    "title": "Open instance drilldown",
    "url": f"/d/{INSTANCE_UID}?var-instance=${{__field.labels.instance}}&${{__url_time_range}}",
}


def target_variables(single_instance: bool = False) -> tuple[Variable, ...]:
    """datasource, job, namespace, model, engine, instance - chained on kvwatch's info series.

    ``instance`` has no custom all-value, so "All" expands to the instances that
    pass the other filters; panels therefore only need ``job`` and ``instance``.
    """
    info = INFO_RECORD
    return (
        Variable("datasource", "Data source", kind="datasource"),
        Variable("job", "Job", f"label_values({info}, job)", all_value=".*"),
        Variable("namespace", "Namespace", f'label_values({info}{{job=~"$job"}}, namespace)', all_value=".*"),
        Variable(
            "model", "Model", f'label_values({info}{{job=~"$job", namespace=~"$namespace"}}, model)', all_value=".*"
        ),
        Variable(
            "engine",
            "Engine",
            f'label_values({info}{{job=~"$job", namespace=~"$namespace", model=~"$model"}}, engine)',
            all_value=".*",
        ),
        Variable(
            "instance",
            "Instance",
            f'label_values({info}{{job=~"$job", namespace=~"$namespace", model=~"$model", engine=~"$engine"}}, instance)',
            include_all=not single_instance,
            multi=not single_instance,
        ),
    )


def _pct(q: float) -> str:
    return f"p{q * 100:g}"


def signals_panel(
    title: str, description: str, series: tuple[tuple[Signal, str], ...], unit: str = "short", width: int = 12
) -> Panel:
    """A time series panel floored at 0: one target per ``(signal, legend suffix)`` of ``series``,
    its legend ``{{instance}} <suffix>``."""
    return Panel(
        title,
        TS,
        description,
        tuple(Target(signal_expr(signal), f"{{{{instance}}}} {suffix}") for signal, suffix in series),
        unit=unit,
        min=0,
        width=width,
    )


def kv_usage_panel(width: int = 12) -> Panel:
    return Panel(
        "KV cache usage per instance",
        TS,
        "Fraction of the KV pool held by running requests (max over data-parallel engines). "
        "High usage alone is not a problem: 60-85 % with no queue, no preemptions and a flat tail is an "
        "efficiently used pool. Read it with the waiting-requests and preemption panels: pinned near 100 % "
        "WITH a queue or preemptions is 'full'; large repeated swings are 'oscillating'; low usage while "
        "requests wait is 'fragmented' or batch-limited. Prefix-cache blocks that no request uses count as free. "
        "Series marked 'proxy' are not KV measurements (TGI: the batch token budget in use).",
        (
            Target(signal_expr(Signal.KV_USAGE, dialects=proxied(Signal.KV_USAGE, False))),
            Target(signal_expr(Signal.KV_USAGE, dialects=proxied(Signal.KV_USAGE)), "{{instance}} (proxy)"),
        ),
        unit="percentunit",
        min=0,
        max=1,
        thresholds=((0.9, "orange"),),
        width=width,
        data_links=(DRILLDOWN_LINK,),
    )


def scheduler_panel(width: int = 12) -> Panel:
    return signals_panel(
        "Waiting and running requests",
        "Requests in the running batch and requests waiting to be scheduled (real time; queue-time histograms "
        "only update when requests finish). A sustained queue with a full KV pool means KV-bound; a queue with "
        "a half-empty pool and running pinned at a constant ceiling means batch-limited (max_num_seqs); a queue "
        "with nothing running and no tokens means a stalled scheduler. 'waiting (capacity)' is vLLM >= 0.20.2's "
        "KV-caused share.",
        ((Signal.WAITING, "waiting"), (Signal.RUNNING, "running"), (Signal.WAITING_CAPACITY, "waiting (capacity)")),
        width=width,
    )


def preemption_panel(width: int = 12) -> Panel:
    return Panel(
        "Preemptions / retractions",
        TS,
        "Running requests evicted to free KV blocks (vLLM preemptions/s, SGLang retractions/s; TensorRT-LLM "
        "reports the paused-requests gauge instead of a rate). Any sustained value means the pool is too small "
        "for the admitted work: every preemption recomputes or swaps a request. With low KV usage it points to "
        "fragmentation or reservation policy.",
        (Target(signal_expr(Signal.PREEMPTIONS)),),
        unit="short",
        min=0,
        width=width,
    )


def latency_panel(signal: Signal, title: str, what: str, width: int = 12, mean: Signal | None = None) -> Panel:
    """p50/p95/p99 of a histogram signal over the dashboard's rate window (never lifetime)."""
    targets = [Target(signal_expr(signal, quantile=q), f"{{{{instance}}}} {_pct(q)}") for q in QUANTILES]
    if mean is not None:
        targets.append(Target(signal_expr(mean), "{{instance}} mean"))
    return Panel(
        title,
        TS,
        f"{what} Quantiles come from histogram buckets rated over the dashboard's window, so they show the "
        "current tail, not a lifetime average. Compare p99 with p50: a p99 many times p50 while the mean looks "
        "fine means a slice of requests (long prompts, one replica, one tenant) suffers - bucket before tuning.",
        tuple(targets),
        unit="s",
        min=0,
        width=width,
    )


def ttft_panel(width: int = 12) -> Panel:
    return latency_panel(
        Signal.TTFT_P99,
        "Time to first token p50 / p95 / p99",
        "Arrival to first token (includes queueing and prefill).",
        width,
        mean=Signal.TTFT_MEAN,
    )


def itl_panel(width: int = 12) -> Panel:
    return latency_panel(
        Signal.ITL_P99,
        "Inter-token latency p50 / p95 / p99",
        "Time between output tokens (TensorRT-LLM serve: per-request TPOT). Rising ITL with a moderate KV pool "
        "points at bandwidth or batch size rather than KV capacity.",
        width,
    )


def queue_panel(width: int = 12) -> Panel:
    return signals_panel(
        "Queue time p99 and mean",
        "Time requests spent queued before scheduling, windowed (rate of sum / rate of count, never lifetime). "
        "It is observed when a request finishes, so it lags during overload - read the waiting-requests panel "
        "for the real-time queue. TensorRT-LLM under Triton exports only Triton's own queue (mean).",
        ((Signal.QUEUE_P99, "p99"), (Signal.QUEUE_MEAN, "mean")),
        unit="s",
        width=width,
    )


def tokens_panel(width: int = 12) -> Panel:
    return signals_panel(
        "Tokens / s",
        "Generated and prompt tokens per second. Throughput that stays flat while KV usage and the queue grow "
        "means the engine is saturated; low throughput with a low pool and no queue is low demand.",
        ((Signal.GEN_TPS, "generated"), (Signal.PROMPT_TPS, "prompt")),
        width=width,
    )


def requests_panel(width: int = 12) -> Panel:
    aborts, done = signal_expr(Signal.ABORT_RATE), signal_expr(Signal.REQUEST_RATE)
    return Panel(
        "Finished requests and abort / error ratio",
        TS,
        "Finished requests per second and the share that were aborted or failed (vLLM finished_reason "
        "abort|error, SGLang aborted, TensorRT-LLM errors/failures). A rising abort ratio with a full pool "
        "usually means clients time out while queued.",
        (
            Target(done, "{{instance}} finished/s"),
            Target(aborts, "{{instance}} aborted/s"),
            Target(f"({aborts}) / ({done})", "{{instance}} abort ratio"),
        ),
        unit="short",
        min=0,
        width=width,
    )


def prefix_panels(width: int = 12) -> tuple[Panel, Panel]:
    return (
        Panel(
            "Prefix-cache hit rate",
            TS,
            "Share of looked-up prompt tokens served from the prefix cache, computed from counters over the "
            "window (not the engines' last-batch or since-start gauges). A high hit rate saves prefill compute; "
            "cached blocks that no running request uses still count as free in KV usage.",
            (Target(prefix_hit_ratio_expr()),),
            unit="percentunit",
            min=0,
            max=1,
            width=width,
        ),
        Panel(
            "Prefill tokens saved by prefix reuse",
            TS,
            "Prompt tokens per second that did not need prefill because their KV was already cached (hit rate "
            "x prompt tokens/s, so it reads in tokens even where the engine counts hits in blocks, e.g. vLLM "
            "0.7.3-0.8.5). Compare with prompt tokens/s: the difference is the prefill work actually done.",
            (Target(prefix_saved_tokens_expr()),),
            unit="short",
            min=0,
            width=width,
        ),
    )


def offload_panel(width: int = 12) -> Panel:
    return Panel(
        "KV offload tier",
        TS,
        "Beyond GPU memory: usage of the CPU offload tier (vLLM kv_offload_cpu_cache_usage_perc) and the hit "
        "ratio of an external KV cache reached through a connector (vLLM external_prefix_cache_*, e.g. "
        "LMCache or NIXL). A full offload tier with a falling external hit ratio means reuse is being "
        "evicted there too. Empty when no connector is configured.",
        (
            Target(extra_expr(Extra.OFFLOAD_USAGE), "{{instance}} CPU tier used"),
            Target(external_hit_ratio_expr(), "{{instance}} external hit ratio"),
            Target(lmcache_hit_ratio_expr(), "{{instance}} LMCache hit ratio"),
        ),
        unit="percentunit",
        min=0,
        max=1,
        width=width,
    )


def length_heatmap(extra: Extra, title: str, width: int = 12) -> Panel:
    return Panel(
        title,
        HEAT,
        "Requests finished per window by length bucket (increase of the histogram buckets). Bimodal shapes "
        "(many short plus a few very long) explain a p99 TTFT far above p50; size the KV pool from p95/p99, not "
        "the mean. Bucket boundaries differ per engine, so filter to one engine for a clean picture.",
        tuple(Target(e, "{{le}}", fmt="heatmap") for e in bucket_increase_exprs(extra)),
        unit="short",
        width=width,
    )


def dashboard_links(this_uid: str) -> tuple[dict[str, object], ...]:
    """Header links to the other kvwatch dashboards, keeping the time range (and filters)."""
    titles = ((FLEET_UID, "KV fleet overview"), (INSTANCE_UID, "Instance drilldown"), (SELF_UID, "kvwatch self"))
    return tuple(
        {
            "asDropdown": False,
            "icon": "dashboard",
            "includeVars": uid != SELF_UID and this_uid != SELF_UID,
            "keepTime": True,
            "tags": [],
            "targetBlank": False,
            "title": title,
            "tooltip": "",
            "type": "link",
            "url": f"/d/{uid}",
        }
        for uid, title in titles
        if uid != this_uid
    )
