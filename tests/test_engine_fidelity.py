"""Engine fidelity: each dialect reads the engine's metrics as the engine's source means them.

One real Prometheus holds a few engines written exactly as their upstream exporters
shape them (docs/engines.md names the files): a Triton server with an ensemble around
the TensorRT-LLM model, Triton with the LLM-API backend, SGLang with every TP rank
exporting, SGLang 0.4.10 with its cumulative retraction gauge, trtllm-serve with
lazily created counters and per-request TPOT, and vLLM with two data-parallel
engines. Every assertion is about a value Prometheus computes from kvwatch's PromQL.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.prom import backfill, prometheus

from kvwatch.core.collect import collect, resolve
from kvwatch.core.dialects import DIALECT_BY_ID, DIALECTS, SourceKind
from kvwatch.core.discover import discover
from kvwatch.core.models import Target, TargetKey
from kvwatch.core.promclient import PromClient
from kvwatch.core.signals import Signal
from kvwatch.tools.dashboards.recording import RECORDS, signal_rules

pytestmark = pytest.mark.prometheus

STEP = 15.0
SPAN = 1200.0
JOB = "fid"
TRITON_FIRST_RESPONSE_MS = (100.0, 500.0, 2000.0, 5000.0)  # triton core metric_model_reporter.h default
VLLM_REQ = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
            480.0, 960.0, 1920.0, 7680.0)
TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


@dataclass
class Writer:
    """OpenMetrics for promtool: one family block per metric name, samples every STEP s."""

    t0: float
    types: dict[str, str] = field(default_factory=dict)
    lines: dict[str, list[str]] = field(default_factory=dict)

    def _add(self, family: str, kind: str, name: str, labels: dict[str, str], f: Callable[[float], float]) -> None:
        self.types.setdefault(family, kind)
        lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        out = self.lines.setdefault(family, [])
        for i in range(int(SPAN // STEP) + 1):
            t = self.t0 + i * STEP
            out.append(f"{name}{{{lab}}} {f(t - self.t0):.6g} {t:.0f}")

    def gauge(self, name: str, f: Callable[[float], float], **labels: str) -> None:
        self._add(name, "gauge", name, labels, f)

    def counter(self, name: str, per_s: float, **labels: str) -> None:
        family = name.removesuffix("_total")
        self._add(family, "counter", f"{family}_total", labels, lambda t: round(per_s * (t + 600.0)))

    def raw_counter(self, name: str, per_s: float, **labels: str) -> None:
        """A C++ (prometheus-cpp) counter scraped without ``_total``: typed unknown for OpenMetrics."""
        self._add(name, "unknown", name, labels, lambda t: round(per_s * (t + 600.0)))

    def hist(self, name: str, bounds: tuple[float, ...], per_s: float, value: float, **labels: str) -> None:
        """Every observation equals ``value`` (``per_s`` of them per second)."""
        self.types.setdefault(name, "histogram")
        for le in (*bounds, math.inf):
            hit = per_s if value <= le else 0.0
            lab = {**labels, "le": "+Inf" if le == math.inf else f"{le:g}"}
            self._add_sample(name, f"{name}_bucket", lab, hit)
        self._add_sample(name, f"{name}_count", labels, per_s)
        self._add_sample(name, f"{name}_sum", labels, per_s * value)

    def _add_sample(self, family: str, name: str, labels: dict[str, str], per_s: float) -> None:
        lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        out = self.lines.setdefault(family, [])
        for i in range(int(SPAN // STEP) + 1):
            t = self.t0 + i * STEP
            out.append(f"{name}{{{lab}}} {per_s * (t - self.t0 + 600.0):.6g} {t:.0f}")

    def text(self) -> str:
        out = []
        for family, rows in self.lines.items():
            out.append(f"# TYPE {family} {self.types[family]}")
            out.extend(rows)
        return "\n".join(out) + "\n# EOF\n"


def _triton(w: Writer, inst: str) -> None:
    """Triton + tensorrtllm_backend: an ensemble (pre → LLM → post), core metrics per model."""
    own = {"job": JOB, "instance": inst}
    llm = {**own, "model": "tensorrt_llm", "version": "1"}
    for kind, v in (("fraction", 0.6), ("max", 1000.0), ("tokens_per", 64.0), ("used", 600.0)):
        w.gauge("nv_trt_llm_kv_cache_block_metrics", lambda t, v=v: v, kv_cache_block_type=kind, **llm)
    for kind, v in (("active", 30.0), ("scheduled", 24.0), ("waiting", 6.0), ("max", 64.0), ("context", 2.0)):
        w.gauge("nv_trt_llm_request_metrics", lambda t, v=v: v, request_type=kind, **llm)
    w.gauge("nv_trt_llm_inflight_batcher_metrics", lambda t: 2.0, inflight_batcher_specific_metric="paused_requests",
            **llm)
    w.gauge("nv_trt_llm_general_metrics", lambda t: round(40.0 * (t + 600.0)), general_type="iteration_counter", **llm)
    # the backend's per-request output lengths: 60 tokens per LLM request, 2 requests/s
    w.hist("nv_llm_output_token_len", (16.0, 64.0, 256.0), 2.0, 60.0, response_metric_type="total_output_tokens",
           **llm)
    # per model: (successes/s, queue s per request, pending, first-response ms, request s)
    models = {"tensorrt_llm": (2.0, 0.5, 0.0, 3000.0, 12.0), "ensemble": (2.0, 0.0, 7.0, 3050.0, 12.1),
              "preprocessing": (6.0, 0.001, 0.0, 20.0, 0.01), "postprocessing": (2.0, 0.0, 0.0, 5.0, 0.005)}
    for model, (ok, queue_s, pending, first_ms, request_s) in models.items():
        lb = {**own, "model": model, "version": "1"}
        w.raw_counter("nv_inference_request_success", ok, **lb)
        w.raw_counter("nv_inference_queue_duration_us", ok * queue_s * 1e6, **lb)
        w.raw_counter("nv_inference_request_duration_us", ok * request_s * 1e6, **lb)
        for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
            w.raw_counter("nv_inference_request_failure", 0.25 if model == "preprocessing" else 0.0,
                          reason=reason, **lb)
        w.gauge("nv_inference_pending_request_count", lambda t, p=pending: p, **lb)
        w.hist("nv_inference_first_response_histogram_ms", TRITON_FIRST_RESPONSE_MS, ok, first_ms, **lb)


def _triton_core_only(w: Writer, inst: str, model: str) -> None:
    """Triton core metrics only (LLM-API Python backend, or a non-LLM model)."""
    lb = {"job": JOB, "instance": inst, "model": model, "version": "1"}
    w.raw_counter("nv_inference_request_success", 1.0, **lb)
    w.raw_counter("nv_inference_queue_duration_us", 1e5, **lb)
    w.gauge("nv_inference_pending_request_count", lambda t: 0.0, **lb)


def _sglang_tp(w: Writer, inst: str, ranks: list[tuple[str, str]], running: dict[str, float]) -> None:
    """SGLang 0.5.23 with enable_metrics_for_all_schedulers: every (dp, tp) rank exports scheduler gauges.

    No aborts yet: ``num_aborted_requests_total`` has no series (created at the first abort).
    """
    own = {"job": JOB, "instance": inst, "model_name": "qwen", "engine_type": "unified"}
    for dp, tp in ranks:
        lb = {**own, "tp_rank": tp, "pp_rank": "0", "priority": "", **({"dp_rank": dp} if dp else {})}
        w.gauge("sglang:num_running_reqs", lambda t, v=running[dp]: v, **lb)
        w.gauge("sglang:num_queue_reqs", lambda t: 5.0, **lb)
        w.gauge("sglang:token_usage", lambda t: 0.43, **lb)
        w.gauge("sglang:num_used_tokens", lambda t: 43210.0, **lb)
        w.gauge("sglang:kv_used_tokens", lambda t: 43210.0, **lb)
        w.gauge("sglang:kv_available_tokens", lambda t: 50000.0, **lb)
        w.gauge("sglang:kv_evictable_tokens", lambda t: 6790.0, **lb)
        w.counter("sglang:num_retracted_requests_total", 0.5, **lb)
    w.counter("sglang:num_requests_total", 3.0, **own)


def _sglang_old(w: Writer, inst: str) -> None:
    """SGLang 0.4.10: ``total_retracted_reqs`` is a cumulative total in a gauge; 7 retractions long ago."""
    lb = {"job": JOB, "instance": inst, "model_name": "qwen", "tp_rank": "0", "pp_rank": "0"}
    w.gauge("sglang:num_running_reqs", lambda t: 12.0, **lb)
    w.gauge("sglang:num_queue_reqs", lambda t: 0.0, **lb)
    w.gauge("sglang:token_usage", lambda t: 0.5, **lb)
    w.gauge("sglang:total_retracted_reqs", lambda t: 7.0, **lb)


def _trtllm_serve(w: Writer, inst: str) -> None:
    """trtllm-serve generation B: no request error yet (lazy counter); 0.5 cancelled/s; 3 paused per iteration."""
    lb = {"job": JOB, "instance": inst, "model_name": "llama", "engine_type": "pytorch"}
    w.counter("trtllm_request_success_total", 2.0, finished_reason="stop", **lb)
    w.counter("trtllm_request_success_total", 0.5, finished_reason="cancelled", **lb)
    w.hist("trtllm_time_to_first_token_seconds", (0.1, 1.0, 10.0), 2.5, 0.5, **lb)
    w.hist("trtllm_time_per_output_token_seconds", TPOT, 2.5, 0.04, **lb)
    w.hist("trtllm_request_queue_time_seconds", VLLM_REQ, 2.5, 0.05, **lb)
    w.gauge("trtllm_kv_cache_utilization", lambda t: 0.7, **lb)
    w.gauge("trtllm_num_paused_requests", lambda t: 3.0, **lb)
    w.gauge("trtllm_iteration_latency_seconds", lambda t: 0.05, **lb)
    w.gauge("trtllm_num_requests_running", lambda t: 20.0, **lb)


def _tgi(w: Writer, inst: str) -> None:
    """TGI's router (router/src/server.rs): 0.5 requests/s finish, each after 6 s end to end with 20
    generated tokens, both histograms observed together at the response."""
    lb = {"job": JOB, "instance": inst}
    w.gauge("tgi_queue_size", lambda t: 0.0, **lb)
    w.gauge("tgi_batch_current_size", lambda t: 1.0, **lb)
    w.gauge("tgi_batch_current_max_tokens", lambda t: 400.0, **lb)
    w.gauge("tgi_batch_max_total_tokens", lambda t: 20000.0, **lb)
    w.hist("tgi_request_duration", VLLM_REQ, 0.5, 6.0, **lb)
    w.hist("tgi_request_generated_tokens", (1.0, 10.0, 100.0, 1000.0), 0.5, 20.0, **lb)


def _vllm_dp(w: Writer, inst: str) -> None:
    """vLLM 0.33 with two data-parallel engines: one KV pool each."""
    for engine in ("0", "1"):
        lb = {"job": JOB, "instance": inst, "model_name": "llama", "engine": engine}
        w.gauge("vllm:kv_cache_usage_perc", lambda t: 0.5, **lb)
        w.gauge("vllm:num_requests_running", lambda t: 10.0, **lb)
        info = {"job": JOB, "instance": inst, "engine": engine, "block_size": "16", "num_gpu_blocks": "1000"}
        w.gauge("vllm:cache_config_info", lambda t: 1.0, **info)
        # 0.33 with LMCache as KV connector and the CPU offloading tier
        w.counter("vllm:external_prefix_cache_queries_total", 120.0, **lb)
        w.counter("vllm:external_prefix_cache_hits_total", 30.0, **lb)
        w.gauge("vllm:kv_offload_cpu_cache_usage_perc", lambda t, e=engine: 0.4 if e == "0" else 0.2, **lb)


@dataclass(frozen=True)
class Env:
    url: str
    at: datetime
    targets: dict[str, Target]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    t0 = float(int(time.time() // 3600) * 3600 - 3 * 3600)
    w = Writer(t0)
    _triton(w, "triton:8002")
    _triton_core_only(w, "llmapi:8002", "tensorrt_llm")
    _triton_core_only(w, "resnet:8002", "resnet50")
    _sglang_tp(w, "sglang-tp4:30000", [("", str(i)) for i in range(4)], {"": 10.0})
    _sglang_tp(w, "sglang-dp2:30000", [(d, t) for d in ("0", "1") for t in ("0", "1")], {"0": 10.0, "1": 6.0})
    _sglang_old(w, "sglang-old:30000")
    _trtllm_serve(w, "serve:8000")
    _vllm_dp(w, "vllm-dp:8000")
    _tgi(w, "tgi:80")
    work = tmp_path_factory.mktemp("fidelity")
    backfill(w.text(), work / "tsdb")
    at = datetime.fromtimestamp(t0 + SPAN, tz=UTC)
    with prometheus(work / "tsdb") as url:
        targets = {t.key.instance.split(":")[0]: t for t in discover(PromClient(url), at, SPAN, "")}
        yield Env(url, at, targets)


def _now(env: Env, name: str, sig: Signal, triton_model: str = "", without: tuple[str, ...] = ()) -> float | None:
    """``sig`` of target ``name`` at the end, as collected (``without``: as if the target did not
    export those metric names)."""
    t = env.targets[name]
    if without:
        t = replace(t, names=t.names - set(without))
    extra = {"triton_model": triton_model} if triton_model else {}
    data = collect(PromClient(env.url), [t], at=env.at, window_s=600.0, step_s=60.0, rate_window="2m",
                   user_matchers="", **extra)
    vals = data.values(t.key, sig)
    return None if vals is None else float(vals[-1])


# 1. Triton core metrics are per model: only the LLM model's series count.
def test_triton_core_metrics_read_the_llm_model_only(env: Env) -> None:
    assert env.targets["triton"].dialect == "trtllm-triton"
    assert _now(env, "triton", Signal.REQUEST_RATE) == pytest.approx(2.0)  # not 6 (preprocessing)
    assert _now(env, "triton", Signal.ABORT_RATE) == pytest.approx(0.0)  # preprocessing's failures excluded
    # queue mean: the LLM's queue time over the LLM's successes (not over preprocessing's 6/s)
    assert _now(env, "triton", Signal.QUEUE_MEAN) == pytest.approx(0.5, rel=1e-3)
    # waiting: active-but-unscheduled plus the LLM model's Triton queue (not the ensemble's 7)
    assert _now(env, "triton", Signal.WAITING) == pytest.approx(6.0)
    # TTFT from the LLM model: all first responses at 3 s, none of preprocessing's 20 ms
    assert 2.0 < (_now(env, "triton", Signal.TTFT_P50) or 0) <= 5.0


def test_triton_request_time_per_output_token_reads_the_llm_model_only(env: Env) -> None:
    # the LLM model's 24 request-seconds/s over its 120 output tokens/s (not the ensemble's, nor the
    # sum over every model of the pipeline, which counts each request's time once per model); read
    # only where no TTFT is (ONLY_WITHOUT), as at Triton's default metrics config
    no_ttft = ("nv_inference_first_response_histogram_ms_count",)
    assert _now(env, "triton", Signal.REQUEST_TIME_PER_TOKEN) is None  # this one exports TTFT
    assert _now(env, "triton", Signal.REQUEST_TIME_PER_TOKEN, without=no_ttft) == pytest.approx(0.2, rel=1e-3)
    assert _now(env, "triton", Signal.REQUEST_TIME_PER_TOKEN, triton_model="tensorrt_llm",
                without=no_ttft) == pytest.approx(0.2, rel=1e-3)


def test_tgi_request_time_per_token_is_the_router_request_time_over_generated_tokens(env: Env) -> None:
    # 0.5 requests/s x 6 s = 3 request-seconds/s over 0.5 x 20 = 10 generated tokens/s
    assert env.targets["tgi"].dialect == "tgi"
    assert _now(env, "tgi", Signal.REQUEST_TIME_PER_TOKEN) == pytest.approx(0.3, rel=1e-3)


def test_triton_llm_model_is_configurable(env: Env) -> None:
    # naming the model explicitly selects it without the join on nv_trt_llm_* series
    assert _now(env, "triton", Signal.REQUEST_RATE, triton_model="preprocessing") == pytest.approx(6.0)
    assert _now(env, "triton", Signal.QUEUE_MEAN, triton_model="tensorrt_llm") == pytest.approx(0.5, rel=1e-3)


# 2. Triton TTFT buckets stop at 5 s: the top bucket is a dialect fact.
def test_triton_ttft_top_bucket_is_five_seconds(env: Env) -> None:
    for sig in (Signal.TTFT_P50, Signal.TTFT_P99, Signal.TTFT_MEAN):
        (src,) = DIALECT_BY_ID["trtllm-triton"].sources[sig]
        assert src.bucket_range == (0.1, 5.0)
        assert "5 s" in src.note and "histogram_latencies" in src.note
    # the LLM's first responses all take 3 s: the p99 interpolates inside (2, 5] and can never exceed 5
    assert _now(env, "triton", Signal.TTFT_P99) <= 5.0


# 3. Triton waiting: documented for what it is and what it cannot see.
def test_triton_waiting_semantics_are_documented() -> None:
    note = DIALECT_BY_ID["trtllm-triton"].sources[Signal.WAITING][0].note
    assert "active - scheduled" in note and "executor's own queue is not exported" in note
    assert "streaming" in note


# 4. Triton with the LLM-API backend: recognised, blind, and says why.
def test_triton_llmapi_backend_is_recognised_but_blind(env: Env) -> None:
    t = env.targets["llmapi"]
    assert (t.engine, t.dialect) == ("trtllm", "trtllm-triton-llmapi")
    assert "resnet" not in env.targets  # a Triton server without an LLM is not an engine
    assert Signal.KV_USAGE not in resolve(t)
    from kvwatch.config import load_settings
    from kvwatch.core.pipeline import evaluate
    from kvwatch.core.rules import load_ruleset

    settings = load_settings(None, environ={}, overrides={"prometheus": {"url": env.url}})
    ev = evaluate(PromClient(env.url), settings, load_ruleset(), env.at)
    (r,) = [r for r in ev.results if r.target.key.instance == "llmapi:8002"]
    assert r.state.value == "unknown"
    assert "LLM-API" in r.diagnoses[0].summary and "nv_trt_llm_" in r.diagnoses[0].summary


# 5. Preemptions are events per second from every source.
def test_sglang_cumulative_retraction_gauge_goes_through_rate(env: Env) -> None:
    assert _now(env, "sglang-old", Signal.PREEMPTIONS) == pytest.approx(0.0)  # not 7 "forever"


def test_trtllm_paused_gauges_become_events_per_second(env: Env) -> None:
    # 2 paused per iteration x 40 iterations/s; 3 paused per iteration / 0.05 s per iteration
    assert _now(env, "triton", Signal.PREEMPTIONS) == pytest.approx(80.0, rel=1e-3)
    assert _now(env, "serve", Signal.PREEMPTIONS) == pytest.approx(60.0, rel=1e-3)


def test_triton_forward_steps_are_the_executor_iteration_counter_rate(env: Env) -> None:
    """The iteration counter is a gauge that only grows (40 iterations/s here): its rate is the
    executor's step rate, which stands still under a wedge while tokens are counted at finish."""
    assert _now(env, "triton", Signal.STEP_RATE) == pytest.approx(40.0, rel=1e-3)


def test_no_preemption_source_is_a_level() -> None:
    for d in DIALECTS:
        for src in d.sources.get(Signal.PREEMPTIONS, ()):
            assert src.kind in (SourceKind.COUNTER, SourceKind.EXPR), (d.id, src.metric)
            if src.kind is SourceKind.EXPR:
                assert "rate(" in src.promql("", "2m") or "avg_over_time(" in src.promql("", "2m")


def test_recording_rule_for_preemptions_is_a_rate_for_every_engine(env: Env) -> None:
    client = PromClient(env.url)
    rules = [r for r in signal_rules() if r["record"] == RECORDS[Signal.PREEMPTIONS]]
    got: dict[str, float] = {}
    for rule in rules:
        for row in client.instant(rule["expr"], env.at):
            got[row["metric"]["instance"].split(":")[0]] = float(row["value"][1])
    assert got["sglang-old"] == pytest.approx(0.0)
    assert got["triton"] == pytest.approx(80.0, rel=1e-3)
    assert got["sglang-tp4"] == pytest.approx(0.5, rel=1e-3)  # one TP group, not 4 ranks


# 6. SGLang scheduler gauges per TP rank: each data-parallel scheduler counted once.
def test_sglang_all_tp_ranks_are_not_multiplied(env: Env) -> None:
    assert _now(env, "sglang-tp4", Signal.RUNNING) == pytest.approx(10.0)
    assert _now(env, "sglang-tp4", Signal.WAITING) == pytest.approx(5.0)
    assert _now(env, "sglang-dp2", Signal.RUNNING) == pytest.approx(16.0)  # dp ranks do add up
    assert _now(env, "sglang-dp2", Signal.WAITING) == pytest.approx(10.0)


# 7. SGLang capacity: exact pool size, not used / rounded usage.
def test_sglang_capacity_from_pool_token_counts(env: Env) -> None:
    assert _now(env, "sglang-tp4", Signal.KV_CAPACITY_TOKENS) == pytest.approx(100_000.0)


# 9. trtllm-serve's time_per_output_token is per-request TPOT, not ITL.
def test_trtllm_serve_tpot_is_not_itl(env: Env) -> None:
    got = resolve(env.targets["serve"])
    assert Signal.ITL_P99 not in got and Signal.TPOT_P99 in got
    assert got[Signal.TPOT_P99].metric == "trtllm_time_per_output_token_seconds"
    assert 0.025 < (_now(env, "serve", Signal.TPOT_P99) or 0) <= 0.05


# 10 + 11. trtllm-serve aborts: cancelled finishes count; the lazy error counter's absence is zero.
def test_trtllm_serve_aborts_and_lazy_counters(env: Env) -> None:
    assert Signal.ABORT_RATE in resolve(env.targets["serve"])
    assert _now(env, "serve", Signal.ABORT_RATE) == pytest.approx(0.5, rel=1e-3)


def test_lazy_counter_absent_reads_zero_and_the_source_is_fixed(env: Env) -> None:
    t = env.targets["sglang-tp4"]
    src = resolve(t)[Signal.ABORT_RATE]
    assert src.metric == "sglang:num_aborted_requests_total" and "sglang:num_aborted_requests_total" not in t.names
    assert _now(env, "sglang-tp4", Signal.ABORT_RATE) == 0.0
    # the same source once the first abort has created the series
    later = Target(t.key, t.dialect, t.engine, t.model, t.names | {"sglang:num_aborted_requests_total"})
    assert resolve(later)[Signal.ABORT_RATE] == src


# 12. vLLM data parallel: capacity is the sum of the engines' pools, like RUNNING.
def test_vllm_data_parallel_capacity_sums_engines(env: Env) -> None:
    assert _now(env, "vllm-dp", Signal.KV_CAPACITY_TOKENS) == pytest.approx(32_000.0)
    assert _now(env, "vllm-dp", Signal.RUNNING) == pytest.approx(20.0)


# 13. Queue histograms start at 0.3 s on vLLM and trtllm-serve: said where a rule reads them.
def test_queue_buckets_start_at_0_3_s_and_say_so() -> None:
    for dialect in ("vllm-v1", "trtllm-serve", "trtllm-serve-legacy"):
        src = DIALECT_BY_ID[dialect].sources[Signal.QUEUE_P99][0]
        assert src.bucket_range is not None and src.bucket_range[0] == 0.3
        assert "interpolated" in src.note
    rules = (Path(__file__).parents[1] / "rules" / "kvwatch" / "failure-modes.yaml").read_text()
    assert "queue p99" in rules and "0.3 s" in rules


def test_sub_bucket_queue_quantile_is_interpolation(env: Env) -> None:
    # every request queued 50 ms; the lowest bucket is 0.3 s, so the "p99" is 0.297 s
    assert _now(env, "serve", Signal.QUEUE_P99) == pytest.approx(0.297, rel=1e-3)
    assert _now(env, "serve", Signal.QUEUE_MEAN) == pytest.approx(0.05, rel=1e-3)


def test_every_key_is_a_target_key(env: Env) -> None:
    assert all(isinstance(t.key, TargetKey) and t.key.job == JOB for t in env.targets.values())


def test_docs_engines_table_covers_every_dialect_with_its_upstream_file() -> None:
    text = (Path(__file__).parents[1] / "docs" / "engines.md").read_text()
    for d in DIALECTS:
        assert d.upstream and d.versions, d.id
        rows = [ln for ln in text.splitlines() if ln.startswith("| ") and f"(`{d.id}`)" in ln]
        assert len(rows) >= sum(len(s) for s in d.sources.values()), d.id
        assert all(ln.rstrip(" |").endswith(d.upstream.replace("|", "\\|")) for ln in rows), d.id


# 14. New vLLM families: the offload tier and the external (connector) cache on the dashboards.
def test_vllm_offload_tier_and_external_cache(env: Env) -> None:
    from kvwatch.core.extras import Extra
    from kvwatch.tools.dashboards.queries import external_hit_ratio_expr, extra_expr

    client = PromClient(env.url)
    (ratio,) = client.instant(external_hit_ratio_expr("", "2m"), env.at)
    assert float(ratio["value"][1]) == pytest.approx(0.25, rel=1e-3)
    (usage,) = client.instant(extra_expr(Extra.OFFLOAD_USAGE, "", "2m"), env.at)
    assert float(usage["value"][1]) == pytest.approx(0.4)  # the fuller engine's tier
    panels = (Path(__file__).parents[1] / "dashboards" / "kvwatch-fleet.json").read_text()
    assert "kv_offload_cpu_cache_usage_perc" in panels and "external_prefix_cache_hits_total" in panels
