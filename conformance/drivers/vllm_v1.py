"""vLLM V1 (0.8 - 0.33+): replay a timeline through ``vllm.v1.metrics.loggers.PrometheusStatLogger``.

Run inside a venv holding vLLM: ``python vllm_v1.py TIMELINE.json SCRAPES.jsonl``. The
logger is built from a real ``VllmConfig`` (a ``ModelConfig`` over a local directory that
holds only a ``config.json``, no weights, no tokenizer) and fed one ``SchedulerStats`` and
one ``IterationStats`` per engine per scrape interval, then ``generate_latest()`` is taken.

What the engine does outside the logger is reproduced from its source: client timeouts
are aborts in the API server, which drop the request without a FinishedRequestStats (no
``request_success{finished_reason="abort"}``); before 0.9 prefix-cache queries and hits
count blocks, not tokens.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from common import Writer, build, expand, finished, load, main_args, small_llama_dir


def vllm_config(doc: dict):
    """A real VllmConfig with the simulated engine's geometry (num_gpu_blocks set as the
    engine sets it after profiling)."""
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

    cfg = doc["config"]
    root = small_llama_dir(cfg, "kvwatch-vllm-model-")
    model_kwargs = {"model": root, "tokenizer": root, "tokenizer_mode": "auto",
                    "trust_remote_code": False, "seed": 0, "skip_tokenizer_init": True,
                    "served_model_name": doc["target"]["model_name"],
                    "max_model_len": int(cfg["max_model_len"]), "dtype": "float16"}
    params = inspect.signature(ModelConfig).parameters
    if "task" in params:
        model_kwargs["task"] = "generate"
    model = ModelConfig(**{k: v for k, v in model_kwargs.items() if k in params})
    cache_kwargs = {"block_size": int(cfg["block_size"]), "gpu_memory_utilization": 0.9,
                    "swap_space": 4, "cache_dtype": "auto", "enable_prefix_caching": True}
    cparams = inspect.signature(CacheConfig).parameters
    cache = CacheConfig(**{k: v for k, v in cache_kwargs.items() if k in cparams})
    cache.num_cpu_blocks = 0
    sched_kwargs = {"max_num_seqs": int(cfg["max_num_seqs"]),
                    "max_num_batched_tokens": int(cfg["max_num_batched_tokens"]),
                    "max_model_len": int(cfg["max_model_len"]),
                    "enable_chunked_prefill": True}  # always on in V1; < 0.9 checks it
    sparams = inspect.signature(SchedulerConfig).parameters
    if "is_encoder_decoder" in sparams:
        sched_kwargs["is_encoder_decoder"] = False
    sched = SchedulerConfig(**{k: v for k, v in sched_kwargs.items() if k in sparams})
    try:
        return VllmConfig(model_config=model, cache_config=cache, scheduler_config=sched)
    except NotImplementedError:
        # < 0.9 with no GPU: the platform is "unspecified" and VllmConfig's checks raise.
        # The logger reads only these parts; each is the release's real config class.
        from types import SimpleNamespace

        from vllm.config import ObservabilityConfig

        print("VllmConfig needs a platform here: stand-in holding the real ModelConfig, "
              "CacheConfig, SchedulerConfig and ObservabilityConfig", file=sys.stderr)
        return SimpleNamespace(model_config=model, cache_config=cache, scheduler_config=sched,
                               observability_config=ObservabilityConfig(),
                               speculative_config=None, lora_config=None)


def _version() -> tuple[int, int]:
    import vllm

    major, minor = vllm.__version__.split(".")[:2]
    return int(major), int(minor)


def main() -> int:
    for tl_path, out_path in main_args():
        replay(load(tl_path), out_path)
    return 0


def _frontend_learns_blocks() -> bool:
    """Whether the API-server process (which serves /metrics) is told the engine core's
    block count: older V1 releases set it only inside the engine core process, so the
    front end's cache_config_info keeps num_gpu_blocks="None" (read from the source)."""
    import inspect as _inspect

    from vllm.v1.engine import core_client

    return "num_gpu_blocks" in _inspect.getsource(core_client)


def _capacity(cache, cfg: dict, engines: int) -> None:
    """What engine start-up sets: the front end sums num_gpu_blocks over data-parallel
    engines; the token capacity and max concurrency stay per engine (full attention)."""
    blocks, bs, mml = int(cfg["num_blocks"]), int(cfg["block_size"]), int(cfg["max_model_len"])
    if not _frontend_learns_blocks():
        return
    cache.num_gpu_blocks = blocks * engines
    if hasattr(cache, "kv_cache_size_tokens"):
        concurrency = blocks / -(-mml // bs)
        cache.kv_cache_size_tokens = int(concurrency * mml)
        cache.kv_cache_max_concurrency = concurrency


def replay(doc: dict, out_path: str) -> None:
    from prometheus_client import REGISTRY, generate_latest
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics import loggers, stats

    engines = doc["engines"]
    cfg = vllm_config(doc)
    _capacity(cfg.cache_config, doc["config"], len(engines))
    init = inspect.signature(loggers.PrometheusStatLogger).parameters
    if "engine_indexes" in init:
        logger = loggers.PrometheusStatLogger(cfg, engine_indexes=list(range(len(engines))))
    elif len(engines) == 1:
        logger = loggers.PrometheusStatLogger(cfg, 0)
    else:
        sys.exit("this vLLM's PrometheusStatLogger takes one engine index; no data parallel")
    if hasattr(logger, "log_engine_initialized"):  # < 0.9 logs cache_config_info in __init__
        logger.log_engine_initialized()
    rec_params = inspect.signature(logger.record).parameters
    blocks = _version() < (0, 9)  # PrefixCacheStats counted blocks before 0.9
    bs = int(doc["config"]["block_size"])
    mml = int(doc["config"]["max_model_len"])
    has_pcs = hasattr(stats, "PrefixCacheStats")
    probe = stats.IterationStats() if not inspect.signature(stats.IterationStats).parameters \
        else stats.IterationStats(True)
    itl_attr = ("inter_token_latencies_iter" if hasattr(probe, "inter_token_latencies_iter")
                else "time_per_output_tokens_iter")
    out = Writer(out_path)
    started = time.monotonic()
    for i in range(len(engines[0])):
        for e, steps in enumerate(engines):
            step = steps[i]
            st, d = step["state"], step["delta"]
            sched = {"num_running_reqs": int(st["running"]), "num_waiting_reqs": int(st["waiting"]),
                     "kv_cache_usage": st["usage"], "gpu_cache_usage": st["usage"]}
            if has_pcs:
                q, h = d["prefix_queries"], d["prefix_hits"]
                if blocks:
                    q, h = q // bs, h // bs
                n_new = len(expand(step["obs"]["ttft"]))
                sched["prefix_cache_stats"] = build(stats.PrefixCacheStats, {
                    "requests": n_new, "queries": int(q), "hits": int(h)})
            s_stats = build(stats.SchedulerStats, sched)
            it = probe.__class__() if not inspect.signature(stats.IterationStats).parameters \
                else probe.__class__(True)
            it.num_generation_tokens = int(d["generation_tokens"])
            prompt, hits = int(d["prompt_tokens"]), int(d["prefix_hits"])
            if hasattr(it, "prompt_token_stats"):
                pts = it.prompt_token_stats
                pts.total, pts.cached_tokens = prompt, min(hits, prompt)
                pts.local_cache_hit, pts.computed = min(hits, prompt), prompt - min(hits, prompt)
            else:
                it.num_prompt_tokens = prompt
            if hasattr(it, "num_preempted_reqs"):
                it.num_preempted_reqs = int(d["preemptions"])
            ttft = expand(step["obs"]["ttft"])
            it.time_to_first_tokens_iter = ttft
            setattr(it, itl_attr, expand(step["obs"]["itl"]))
            if hasattr(it, "n_params_iter"):
                it.n_params_iter = [1] * len(ttft)
            reqs = []
            for r in finished(step):
                inference = max(r["e2e"] - r["queue"], 0.0)
                decode = min(r["tpot_req"] * max(r["gen_tokens"] - 1, 0), inference)
                reqs.append(build(stats.FinishedRequestStats, {
                    "finish_reason": FinishReason.STOP if r["reason"] == "stop"
                    else FinishReason.LENGTH,
                    "request_id": None, "e2e_latency": r["e2e"],
                    "num_prompt_tokens": int(r["prompt_tokens"]),
                    "num_generation_tokens": int(r["gen_tokens"]),
                    # what the OpenAI server sets when the client gives none
                    "max_tokens_param": max(mml - int(r["prompt_tokens"]), 1),
                    "queued_time": r["queue"],
                    "prefill_time": inference - decode, "inference_time": inference,
                    "decode_time": decode, "mean_time_per_output_token": r["tpot_req"]}))
            it.finished_requests = reqs
            if "engine_idx" in rec_params:
                logger.record(s_stats, it, engine_idx=e)
            else:
                logger.record(s_stats, it)
        out.scrape(step["t"], generate_latest(REGISTRY))
    out.close()
    print(f"{len(engines[0])} scrapes x {len(engines)} engines in "
          f"{time.monotonic() - started:.1f}s", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
