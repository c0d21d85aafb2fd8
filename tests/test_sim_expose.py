"""Every dialect's exposition parses and uses exactly the real names of engine-metrics.md."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.prom import unavailable

from kvwatch.sim import buckets as B
from kvwatch.sim.engine import Engine
from kvwatch.sim.expose import exposition
from kvwatch.sim.fleet import make_targets
from kvwatch.sim.vocab import Dialect

V = "vllm:"
VLLM_HIST = {f"{V}request_prompt_tokens", f"{V}request_generation_tokens",
             f"{V}time_to_first_token_seconds", f"{V}e2e_request_latency_seconds",
             f"{V}request_queue_time_seconds"}
VLLM_COMMON = {f"{V}num_requests_running", f"{V}num_requests_waiting", f"{V}cache_config_info",
               f"{V}num_preemptions_total", f"{V}prompt_tokens_total",
               f"{V}generation_tokens_total", f"{V}request_success_total"} | VLLM_HIST
SGLANG_05 = {"token_usage", "num_used_tokens", "max_total_num_tokens", "num_running_reqs",
             "num_queue_reqs", "num_retracted_requests_total", "prompt_tokens_total",
             "generation_tokens_total", "cached_tokens_total", "num_requests_total",
             "num_aborted_requests_total", "time_to_first_token_seconds",
             "inter_token_latency_seconds", "e2e_request_latency_seconds", "queue_time_seconds",
             "gen_throughput", "cache_hit_rate", "realtime_tokens_total", "request_time_per_output_token_seconds"}
SERVE_LATENCY = {"request_success_total", "e2e_request_latency_seconds",
                 "time_to_first_token_seconds", "time_per_output_token_seconds",
                 "request_queue_time_seconds"}

#: the contract: ``# TYPE`` names per dialect (counters as exposed, with ``_total``)
EXPECTED: dict[Dialect, set[str]] = {
    Dialect.VLLM_0_33: VLLM_COMMON | {
        f"{V}num_requests_waiting_by_reason", f"{V}kv_cache_usage_perc",
        f"{V}prefix_cache_queries_total", f"{V}prefix_cache_hits_total",
        f"{V}inter_token_latency_seconds", f"{V}request_time_per_output_token_seconds"},
    Dialect.VLLM_0_10: VLLM_COMMON | {
        f"{V}kv_cache_usage_perc", f"{V}gpu_cache_usage_perc", f"{V}prefix_cache_queries_total",
        f"{V}prefix_cache_hits_total", f"{V}gpu_prefix_cache_queries_total",
        f"{V}gpu_prefix_cache_hits_total", f"{V}inter_token_latency_seconds",
        f"{V}time_per_output_token_seconds"},
    Dialect.VLLM_0_8_2: VLLM_COMMON | {
        f"{V}gpu_cache_usage_perc", f"{V}gpu_prefix_cache_queries_total",
        f"{V}gpu_prefix_cache_hits_total", f"{V}time_per_output_token_seconds"},
    Dialect.VLLM_V0_0_6: VLLM_COMMON | {
        f"{V}gpu_cache_usage_perc", f"{V}cpu_cache_usage_perc", f"{V}num_requests_swapped",
        f"{V}gpu_prefix_cache_hit_rate", f"{V}avg_prompt_throughput_toks_per_s",
        f"{V}avg_generation_throughput_toks_per_s", f"{V}time_per_output_token_seconds"},
    Dialect.SGLANG_0_5: {f"sglang:{n}" for n in SGLANG_05},
    # Ray Serve LLM: the native names sanitised for OpenTelemetry and prefixed ray_
    Dialect.SGLANG_RAY: {f"ray_sglang_{n}" for n in SGLANG_05},
    Dialect.SGLANG_0_4_0: {f"sglang:{n}" for n in (
        "prompt_tokens_total", "generation_tokens_total", "token_usage", "cache_hit_rate",
        "time_to_first_token_seconds", "e2e_request_latency_seconds",
        "time_per_output_token_seconds", "num_running_reqs", "num_used_tokens",
        "gen_throughput", "num_queue_reqs")},
    Dialect.TRTLLM_TRITON: {
        "nv_trt_llm_request_metrics", "nv_trt_llm_runtime_memory_metrics",
        "nv_trt_llm_kv_cache_block_metrics", "nv_trt_llm_inflight_batcher_metrics",
        "nv_trt_llm_general_metrics", "nv_inference_request_success",
        "nv_inference_request_failure", "nv_inference_count", "nv_inference_queue_duration_us",
        "nv_inference_request_duration_us", "nv_inference_pending_request_count",
        "nv_llm_input_token_len", "nv_llm_output_token_len"},
    Dialect.TRTLLM_SERVE: {f"trtllm_{n}" for n in SERVE_LATENCY} | {f"trtllm_{n}" for n in (
        "kv_cache_utilization", "kv_cache_max_blocks", "kv_cache_free_blocks",
        "kv_cache_used_blocks", "kv_cache_tokens_per_block", "num_requests_running",
        "num_requests_waiting", "num_scheduled_requests", "num_paused_requests",
        "num_context_requests", "num_generation_requests", "max_num_active_requests",
        "iteration_latency_seconds", "prompt_tokens_total", "generation_tokens_total")},
    Dialect.TRTLLM_SERVE_GEN_A: SERVE_LATENCY,
}
EXPECTED[Dialect.VLLM_RAY] = {"ray_" + n.replace(":", "_") for n in EXPECTED[Dialect.VLLM_0_33]}
EXPECTED[Dialect.LMDEPLOY] = {f"lmdeploy:{n}" for n in (
    "num_requests_succeeded", "num_requests_failed", "num_api_requests_routed", "num_api_requests_waiting",
    "num_requests_running", "num_requests_waiting", "gpu_cache_usage_perc", "prefix_cache_hit_rate",
    "prompt_tokens_total", "generation_tokens_total", "cached_tokens_total", "request_success_total",
    "request_prompt_tokens", "request_generation_tokens", "time_to_first_token_seconds",
    "time_per_output_token_seconds", "iter_token_latency", "e2e_request_latency_seconds",
    "request_queue_time_seconds")}
EXPECTED[Dialect.TGI] = {f"tgi_{n}" for n in (
    "queue_size", "batch_current_size", "batch_current_max_tokens", "batch_max_total_tokens", "request_count",
    "request_success", "request_failure", "request_queue_duration", "request_mean_time_per_token_duration",
    "request_duration", "request_input_length", "request_generated_tokens", "batch_inference_count")}
EXPECTED[Dialect.DYNAMO_FRONTEND] = {f"dynamo_frontend_{n}" for n in (
    "inflight_requests", "queued_requests", "requests_total", "request_duration_seconds", "output_tokens_total", "time_to_first_token_seconds",
    "inter_token_latency_seconds", "input_sequence_tokens", "model_total_kv_blocks", "model_kv_cache_block_size",
    "model_max_num_seqs", "worker_active_decode_blocks")}
EXPECTED[Dialect.DYNAMO_WORKER] = {f"dynamo_component_{n}" for n in (
    "inflight_requests", "requests_total", "errors_total", "kvstats_gpu_cache_usage_percent", "kvstats_total_blocks")}
#: names read in upstream source for engines shared/engine-metrics.md does not cover
UPSTREAM_NAMES = {ln.strip() for ln in (Path(__file__).parent / "fixtures" / "engines" /
                                        "upstream-metric-names.txt").read_text().splitlines()
                  if ln.strip() and not ln.startswith("#")}
CREATED_AT = 1_790_000_000.0


@cache
def scrape(dialect: Dialect) -> tuple[str, tuple[Engine, ...]]:
    """Exposition of a target of the ``full`` preset after 5 simulated minutes."""
    dp = 2 if dialect is Dialect.VLLM_0_33 else 1
    spec = make_targets("full", dialect, 7, run_s=600, data_parallel=dp)[0]
    seg = spec.replica.segments[0]
    engines = tuple(Engine(seg.config, seg.workload, seed=i) for i in range(dp))
    for e in engines:
        e.run(300)
    views = [e.view(1_795_000_000.0) for e in engines]
    return exposition(dialect, views, spec.model_name, created_at=CREATED_AT), engines


def type_names(text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text)
            for s in fam.samples]


@pytest.mark.parametrize("dialect", list(Dialect), ids=str)
def test_names_are_exactly_the_dialects(dialect: Dialect) -> None:
    text, _ = scrape(dialect)
    names = type_names(text)
    created = {n for n in names if n.endswith("_created")}
    assert names - created == EXPECTED[dialect]
    if dialect in (Dialect.VLLM_0_33, Dialect.VLLM_0_10):
        assert f"{V}num_preemptions_created" in created  # prometheus_client single-process
    else:
        assert not created
    assert text.endswith("\n") and samples(text)  # parses


def _doc() -> str:
    here = Path(__file__).resolve()
    for cand in (here.parents[2] / "shared", here.parents[1].parent / "shared",
                 Path("/work/shared")):
        if (cand / "engine-metrics.md").is_file():
            return (cand / "engine-metrics.md").read_text()
    msg = "shared/engine-metrics.md not found beside the repository"
    unavailable(msg)
    raise AssertionError("unreachable")


@pytest.mark.parametrize("dialect", list(Dialect), ids=str)
def test_every_name_is_documented_in_engine_metrics_md(dialect: Dialect) -> None:
    doc = _doc()
    for name in type_names(scrape(dialect)[0]):
        if name.endswith("_created"):
            continue
        # Ray Serve re-exports the native names as ray_<engine>_<rest> (':' is not OTel-safe)
        canonical = re.sub(r"^ray_(vllm|sglang)_", r"\1:", name)
        if canonical in UPSTREAM_NAMES:
            continue
        assert re.search(rf"(?<![\w:]){re.escape(canonical)}(?![\w])", doc), name


def test_vllm_labels_engine_and_cache_config() -> None:
    text, engines = scrape(Dialect.VLLM_0_33)
    rows = samples(text)
    assert {lb["engine"] for _, lb, _ in rows} == {"0", "1"}  # data parallel
    info = [lb for n, lb, _ in rows if n == "vllm:cache_config_info"]
    cfg = engines[0].cfg
    assert info[0]["kv_cache_size_tokens"] == str(cfg.num_blocks * cfg.block_size)
    # the real 0.33 front end sums num_gpu_blocks over data-parallel engines (conformance/)
    assert info[0]["num_gpu_blocks"] == str(2 * cfg.num_blocks) and "model_name" not in info[0]
    reasons = {lb["finished_reason"] for n, lb, _ in rows if n == "vllm:request_success_total"}
    assert reasons == {"stop", "length", "abort", "error", "repetition"}
    by_reason = {lb["reason"] for n, lb, _ in rows if n == "vllm:num_requests_waiting_by_reason"}
    assert by_reason == {"capacity", "deferred"}
    pre = [v for n, lb, v in rows if n == "vllm:num_preemptions_total" and lb["engine"] == "0"]
    assert pre == [engines[0].c[0]]
    old = samples(scrape(Dialect.VLLM_0_8_2)[0])
    assert all("engine" not in lb for _, lb, _ in old)
    info = [lb for n, lb, _ in old if n == "vllm:cache_config_info"]
    assert info[0]["num_gpu_blocks"] == "None"  # the V1 0.8.x bug


@pytest.mark.parametrize(("dialect", "name", "expect"), [
    (Dialect.VLLM_0_10, "vllm:num_requests_running", "running_shown"),
    (Dialect.VLLM_V0_0_6, "vllm:num_requests_running", "running_shown"),
    (Dialect.VLLM_RAY, "ray_vllm_num_requests_running", "running_shown"),
    (Dialect.SGLANG_0_5, "sglang:num_running_reqs", "running_shown"),
    (Dialect.SGLANG_0_4_0, "sglang:num_running_reqs", "running_shown"),
    (Dialect.SGLANG_RAY, "ray_sglang_num_running_reqs", "running_shown"),
], ids=str)
def test_vllm_shows_running_after_the_step_finished_requests_left(dialect: Dialect, name: str, expect: str) -> None:
    """vLLM's running gauge is read after the step's finished requests left the batch (V1
    ``update_from_output`` then ``make_stats``; V0 frees them before logging); so is SGLang's
    (the scheduler logs the decode batch that ran, filtered of the previous step's finished
    requests, and at a prefill the running batch before the refill). Here a view whose gauge
    would differ by 7."""
    from dataclasses import replace

    _, engines = scrape(Dialect.VLLM_0_10)
    view = engines[0].view(1_795_000_000.0)
    g = dict(view.g)
    g["running"], g["running_shown"] = 64.0, 57.0
    text = exposition(dialect, [replace(view, g=g)], "m", created_at=CREATED_AT)
    got = {v for n, lb, v in samples(text) if n == name}
    assert got == {g[expect]}, got


@pytest.mark.parametrize(("dialect", "name", "bounds"), [
    (Dialect.VLLM_0_33, "vllm:time_to_first_token_seconds", B.VLLM_TTFT),
    (Dialect.VLLM_0_8_2, "vllm:time_to_first_token_seconds", B.VLLM_TTFT_OLD),
    (Dialect.VLLM_V0_0_6, "vllm:time_per_output_token_seconds", B.VLLM_ITL_OLD),
    (Dialect.VLLM_0_10, "vllm:request_queue_time_seconds", B.VLLM_LATENCY),
    (Dialect.SGLANG_0_5, "sglang:time_to_first_token_seconds", B.SGLANG_TTFT),
    (Dialect.SGLANG_0_4_0, "sglang:time_to_first_token_seconds", B.SGLANG_TTFT_OLD),
    (Dialect.TRTLLM_TRITON, "nv_llm_input_token_len", B.TRITON_TOKENS),
    (Dialect.TRTLLM_SERVE, "trtllm_time_per_output_token_seconds", B.VLLM_ITL),
], ids=lambda x: str(x) if isinstance(x, Dialect | str) else "")
def test_real_bucket_boundaries(dialect: Dialect, name: str, bounds: tuple[float, ...]) -> None:
    rows = [(lb, v) for n, lb, v in samples(scrape(dialect)[0]) if n == f"{name}_bucket"]
    engine0 = [(lb, v) for lb, v in rows if lb.get("engine", "0") == "0"]
    les = [float(lb["le"]) for lb, _ in engine0]
    assert les == [*bounds, float("inf")]
    counts = [v for _, v in engine0]
    assert counts == sorted(counts) and counts[-1] > 0
    assert bounds[0] == 0.1 or dialect is not Dialect.SGLANG_0_5


def test_sglang_trtllm_label_shapes() -> None:
    rows = samples(scrape(Dialect.SGLANG_0_5)[0])
    usage = [(lb, v) for n, lb, v in rows if n == "sglang:token_usage"]
    # as SGLang 0.5.23's own collector labels them (tests/fixtures/conformance)
    assert usage[0][0] == {"model_name": usage[0][0]["model_name"], "engine_type": "unified",
                           "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
    old = samples(scrape(Dialect.SGLANG_0_4_0)[0])
    usage_old = [v for n, _, v in old if n == "sglang:token_usage"]
    assert round(usage_old[0], 2) == usage_old[0]  # the 0.4 scheduler rounds to 2 decimals
    triton = samples(scrape(Dialect.TRTLLM_TRITON)[0])
    assert all(lb["version"] == "1" for _, lb, _ in triton)
    # backend metrics belong to the LLM model; Triton core metrics exist for every model of the ensemble
    assert {lb["model"] for n, lb, _ in triton if n.startswith("nv_trt_llm_")} == {"tensorrt_llm"}
    assert {lb["model"] for n, lb, _ in triton if n.startswith("nv_inference_request_success")} == {
        "tensorrt_llm", "ensemble", "preprocessing", "postprocessing"}
    types = {lb["kv_cache_block_type"] for n, lb, _ in triton
             if n == "nv_trt_llm_kv_cache_block_metrics"}
    assert types == {"max", "free", "used", "tokens_per", "fraction", "reused"}
    kinds = {lb["request_type"] for n, lb, _ in triton if n == "nv_trt_llm_request_metrics"}
    assert kinds == {"active", "max", "scheduled", "context", "waiting"}
    serve = samples(scrape(Dialect.TRTLLM_SERVE)[0])
    assert all(lb["engine_type"] == "pytorch" for _, lb, _ in serve)
    gen_a = samples(scrape(Dialect.TRTLLM_SERVE_GEN_A)[0])
    assert {(lb["model_name"], lb["engine_type"]) for _, lb, _ in gen_a} == {
        ("undefined", "undefined")}
    assert not [n for n, _, _ in gen_a if "kv" in n]  # a real blind spot
