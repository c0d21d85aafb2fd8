"""The dialect table: every dialect in detection priority order, and lookups over it."""

from __future__ import annotations

import functools

from kvwatch.core.dialects.dynamo import dynamo_frontend_sources, dynamo_worker_sources
from kvwatch.core.dialects.lmdeploy import lmdeploy_sources
from kvwatch.core.dialects.model import Dialect, Source
from kvwatch.core.dialects.sglang import sglang_sources
from kvwatch.core.dialects.tgi import tgi_sources
from kvwatch.core.dialects.trtllm import (
    TRITON_LLMAPI_BLIND,
    TRITON_LLMAPI_SOURCES,
    TRITON_MARKERS,
    TRITON_SOURCES,
    trtllm_serve_sources,
)
from kvwatch.core.dialects.vllm import VLLM_SOURCES, vllm_sources
from kvwatch.core.models import Target
from kvwatch.core.signals import ONLY_WITHOUT, Signal

_DYN_UP = "ai-dynamo/dynamo:lib/runtime/src/metrics/prometheus_names.rs@04070c75"
_SGL_UP = "sgl-project/sglang:python/sglang/srt/observability/metrics_collector.py@016d8605"
_VLLM_UP = "vllm-project/vllm:vllm/v1/metrics/loggers.py (wheels 0.7.3-0.33.0, shared/engine-metrics.md §1)"
_RAY_UP = "vllm/v1/metrics/ray_wrappers.py, sglang:python/sglang/srt/observability/ray_wrappers.py@18cc7bf2"
_TRITON_UP = ("NVIDIA/TensorRT-LLM:triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/"
              "custom_metrics_reporter.cc@89fd9b74; triton-inference-server/core:src/metric_model_reporter.{h,cc}@73aad7c3")
_SERVE_UP = "NVIDIA/TensorRT-LLM:tensorrt_llm/metrics/collector.py (2026 main)"

#: All dialects, in detection priority order (first match wins for a target).
DIALECTS: tuple[Dialect, ...] = (
    Dialect(
        "vllm-v0",
        "vllm",
        ("vllm:num_requests_swapped", "vllm:cpu_cache_usage_perc", "vllm:avg_generation_throughput_toks_per_s"),
        VLLM_SOURCES,
        versions="V0 <= 0.10.x",
        upstream="vllm-project/vllm:vllm/engine/metrics.py (wheels 0.4.3-0.10.2)",
    ),
    Dialect(
        "vllm-v1",
        "vllm",
        ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        VLLM_SOURCES,
        versions="V1 0.7.3-0.33.0",
        upstream=_VLLM_UP,
    ),
    Dialect(
        "vllm-ray",
        "vllm",
        ("ray_vllm_num_requests_running", "ray_vllm_kv_cache_usage_perc", "ray_vllm_gpu_cache_usage_perc"),
        vllm_sources("ray_vllm_"),
        versions="vLLM V1 under Ray Serve LLM (RayPrometheusStatLogger), labels + ReplicaId, WorkerId",
        upstream=_RAY_UP,
    ),
    Dialect(
        "vllm-ray-colon",
        "vllm",
        ("ray_vllm:num_requests_running", "ray_vllm:kv_cache_usage_perc", "ray_vllm:gpu_cache_usage_perc"),
        vllm_sources("ray_vllm:"),
        versions="vLLM under older Ray (the name kept its colon)",
        upstream="ray-project/ray:python/ray/dashboard/modules/metrics/dashboards/serve_llm_dashboard_panels.py",
    ),
    Dialect(
        "sglang",
        "sglang",
        ("sglang:num_running_reqs", "sglang:token_usage"),
        sglang_sources("sglang:"),
        versions="0.3.6-0.5.23",
        upstream=_SGL_UP,
    ),
    Dialect(
        "sglang-ray",
        "sglang",
        ("ray_sglang_num_running_reqs", "ray_sglang_token_usage"),
        sglang_sources("ray_sglang_"),
        versions="SGLang under Ray Serve LLM (stat_loggers DI + Ray wrappers), labels + ReplicaId, WorkerId",
        upstream=_RAY_UP,
    ),
    Dialect(
        "lmdeploy",
        "lmdeploy",
        ("lmdeploy:gpu_cache_usage_perc", "lmdeploy:num_requests_running"),
        lmdeploy_sources("lmdeploy:"),
        versions="PyTorch and TurboMind engines with --enable-metrics",
        upstream="InternLM/lmdeploy:lmdeploy/metrics/loggers.py@1263d5cd",
    ),
    Dialect(
        "tgi",
        "tgi",
        ("tgi_queue_size", "tgi_batch_current_size"),
        tgi_sources(),
        versions="text-generation-inference router (v2/v3 backends)",
        upstream=("huggingface/text-generation-inference:docs/source/reference/metrics.md@53fdbe61, "
                  "backends/v3/src/lib.rs (tgi_batch_max_total_tokens)"),
    ),
    Dialect(
        "dynamo-frontend",
        "dynamo",
        ("dynamo_frontend_inflight_requests", "dynamo_frontend_queued_requests"),
        dynamo_frontend_sources(),
        versions="NVIDIA Dynamo frontend (HTTP :8000/metrics)",
        upstream=_DYN_UP,
    ),
    Dialect("trtllm-triton", "trtllm", TRITON_MARKERS, TRITON_SOURCES, versions="tensorrtllm_backend (C++), Triton >= 23.11",
            upstream=_TRITON_UP),
    Dialect(
        "trtllm-triton-llmapi",
        "trtllm",
        ("nv_inference_request_success",),
        TRITON_LLMAPI_SOURCES,
        model_pattern="tensorrt_llm",
        blind_reason=TRITON_LLMAPI_BLIND,
        versions="Triton + TensorRT-LLM LLM-API (Python) backend",
        upstream="triton-inference-server/core:src/metrics.cc@73aad7c3 (core metrics only)",
    ),
    Dialect(
        "trtllm-serve",
        "trtllm",
        ("trtllm_kv_cache_utilization", "trtllm_num_requests_running", "trtllm_time_to_first_token_seconds_count"),
        trtllm_serve_sources("trtllm_", ""),
        versions="trtllm-serve /prometheus/metrics, trtllm_ prefix (generation B)",
        upstream=_SERVE_UP,
    ),
    Dialect(
        "trtllm-serve-legacy",
        "trtllm",
        ("time_to_first_token_seconds_count", "request_success_total"),
        trtllm_serve_sources("", 'engine_type!=""'),
        required_label="engine_type",
        versions="trtllm-serve generation A (no prefix, 5 families)",
        upstream="NVIDIA/TensorRT-LLM:tensorrt_llm/metrics/collector.py@89fd9b74",
    ),
)

DIALECTS = (
    *DIALECTS,
    # last: a worker that also re-exports its engine's metrics is detected as that engine
    Dialect(
        "dynamo-worker",
        "dynamo",
        ("dynamo_component_kvstats_gpu_cache_usage_percent",),
        dynamo_worker_sources(),
        versions="NVIDIA Dynamo worker runtime metrics (system port, e.g. :8081/metrics)",
        upstream=_DYN_UP,
        defer_to=("vllm", "sglang", "trtllm", "lmdeploy"),
    ),
)

DIALECT_BY_ID: dict[str, Dialect] = {d.id: d for d in DIALECTS}


def all_names() -> list[str]:
    """Every metric name any dialect needs, sorted: the discovery query asks for exactly these."""
    out: set[str] = set()
    for d in DIALECTS:
        out |= d.names()
    return sorted(out)


def kv_proxy(dialect_id: str) -> str:
    """What a dialect's KV usage really measures when it is only a proxy (else ``""``)."""
    d = DIALECT_BY_ID.get(dialect_id)
    srcs = d.sources.get(Signal.KV_USAGE, ()) if d else ()
    return srcs[0].proxy if srcs and all(s.proxy for s in srcs) else ""


@functools.lru_cache(maxsize=16384)
def resolve(target: Target) -> dict[Signal, Source]:
    """The source each signal uses for this target: the first of its dialect's sources whose
    required metrics the target exports (signals without one are absent; a stand-in of
    :data:`~kvwatch.core.signals.ONLY_WITHOUT` is absent where the signal it stands in for is not).

    Cached: the same targets are resolved by planning, collection, diagnosis and every cycle.
    Callers must not mutate the returned mapping.
    """
    d = DIALECT_BY_ID.get(target.dialect)
    out: dict[Signal, Source] = {}
    for sig, sources in d.sources.items() if d else ():
        for src in sources:
            if all(n in target.names for n in src.requires):
                out[sig] = src
                break
    for sig, preferred in ONLY_WITHOUT.items():
        if preferred in out:
            out.pop(sig, None)
    return out


def waiting_is_estimate(target: Target) -> bool:
    """Whether a target's ``waiting`` is a fallback estimate (the Little's-law queue from a
    queue-time histogram, smoothed over its rate window) rather than a queue gauge."""
    src = resolve(target).get(Signal.WAITING)
    return src is not None and bool(src.estimate)


def waiting_shows_stalls(target: Target) -> bool:
    """Whether a target's ``waiting`` shows the requests a wedged scheduler holds: a queue gauge
    that counts them, not an executor queue alone (requests admitted, unscheduled, uncounted) nor
    a Little's-law estimate (a request stuck in the queue never reports its queue time).
    True where no queue source is known (nothing exported: the queue leaf itself is undecidable)."""
    src = resolve(target).get(Signal.WAITING)
    return src is None or not (src.estimate or src.misses_admitted)


def aborts_count_as_finished(target: Target) -> bool:
    """Whether a target's finished-requests counter (``request_rate``) counts aborted requests
    too, so its progress is that rate minus ``abort_rate`` (True where it has no such counter:
    nothing is subtracted from nothing)."""
    src = resolve(target).get(Signal.REQUEST_RATE)
    return src is None or src.counts_aborted


def tokens_counted_at_finish(target: Target) -> bool:
    """Whether a target's token progress (``gen_tps``) is counted when requests finish rather
    than per step (False where it has no token source: nothing is read from nothing)."""
    src = resolve(target).get(Signal.GEN_TPS)
    return src is not None and src.counted_at_finish


def running_after_finishes(target: Target) -> bool:
    """Whether a target's running gauge is read after each step's finished requests left the
    batch (vLLM, SGLang), so a batch at its cap dips below it by the step's completions."""
    src = resolve(target).get(Signal.RUNNING)
    return src is not None and src.after_finishes


def waiting_counts_prefill(dialect_id: str) -> bool:
    """Whether a dialect's waiting gauge also counts requests in prefill (until their first token)."""
    d = DIALECT_BY_ID.get(dialect_id)
    srcs = d.sources.get(Signal.WAITING, ()) if d else ()
    return bool(srcs) and all(s.counts_prefill for s in srcs)
