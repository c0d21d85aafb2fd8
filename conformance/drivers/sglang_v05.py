"""SGLang 0.5.x: replay a timeline through SGLang's own metrics collectors, served the way
SGLang serves them (prometheus_client multiprocess mode, one process per scheduler rank).

Run inside a venv holding SGLang: ``python sglang_v05.py TIMELINE.json SCRAPES.jsonl ...``.
Per timeline a process publishes the tokenizer's runtime context and builds the
``TokenizerMetricsCollector``; one forked process per tensor-parallel rank publishes the
scheduler context for its rank and builds its ``SchedulerMetricsCollector`` through
``init_new`` (as the scheduler does), emits the start-up constants and calls
``log_stats`` / ``increment_retracted_reqs`` / ``observe_queue_time`` /
``increment_realtime_tokens`` per scrape interval.
Each scrape is what ``/metrics`` returns: ``MultiProcessCollector`` over the shared
directory, rendered by ``generate_latest``.

Timeline options: ``tp_size`` (with ``enable_metrics_for_all_schedulers`` when > 1) and
``priority`` (``enable_priority_scheduling``; every request has priority 0).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
MULTIPROC = tempfile.mkdtemp(prefix="kvwatch-sglang-prom-")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = MULTIPROC  # before prometheus_client is imported

from common import Writer, expand, finished, replay_each_forked, small_llama_dir  # noqa: E402


def server_args(doc: dict):
    from sglang.srt.server_args import ServerArgs

    cfg, opts = doc["config"], doc.get("options", {})
    tp = int(opts.get("tp_size", 1))
    return ServerArgs(
        model_path=small_llama_dir(cfg, "kvwatch-sglang-model-"),
        served_model_name=doc["target"]["model_name"],
        device="cpu", skip_tokenizer_init=True, enable_metrics=True, tp_size=tp,
        enable_metrics_for_all_schedulers=tp > 1,
        enable_priority_scheduling=bool(opts.get("priority")),
        context_length=int(cfg["max_model_len"]), max_running_requests=int(cfg["max_num_seqs"]),
        page_size=int(cfg["block_size"]))


def _queue_count(n: float, priority: bool):
    from sglang.srt.observability.metrics_collector import QueueCount

    return QueueCount(total=int(n), by_priority={0: int(n)} if priority else None)


def rank_worker(sa, rank: int, doc: dict, conn) -> None:
    """One scheduler rank: its own process, runtime context and collector."""
    from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector, SchedulerStats
    from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank

    publish(sa, role="scheduler", ranks=SpawnRanks(
        world_rank=spawn_world_rank(sa, tp_rank=rank, pp_rank=0), dp_rank=None, gpu_id=None))
    prio = bool(sa.enable_priority_scheduling)
    ctx = SchedulerMetricsCollector.init_new(server_args=sa, enable_priority_scheduling=prio,
                                             enable_lora=False, enable_hierarchical_cache=False)
    col = ctx.collector
    cfg = doc["config"]
    total = int(cfg["num_blocks"]) * int(cfg["block_size"])
    if ctx.current_scheduler_metrics_enabled:
        col.emit_constants(max_total_num_tokens=total, max_total_num_tokens_swa=None,
                           weight_memory_usage_gb=1.0, kv_cache_memory_usage_gb=10.0,
                           graph_memory_usage_gb={}, max_running_requests_under_SLO=None,
                           page_size=int(cfg["block_size"]),
                           num_pages=int(cfg["num_blocks"]),
                           context_len=int(cfg["max_model_len"]),
                           startup_available_gpu_memory_gb=70.0)
    steps = doc["engines"][0]
    while True:
        i = conn.recv()
        if i is None:
            break
        st, d = steps[i]["state"], steps[i]["delta"]
        if ctx.current_scheduler_metrics_enabled:
            for q in expand(steps[i]["obs"]["queue"]):
                col.observe_queue_time(q)
            if d["preemptions"] > 0:
                col.increment_retracted_reqs(num_retracted_reqs=int(d["preemptions"]),
                                             num_retracted_input_tokens=0,
                                             num_retracted_output_tokens=0)
            used = round(st["used_blocks"] * int(cfg["block_size"]))
            q, h = d["prefix_queries"], d["prefix_hits"]
            col.log_stats(SchedulerStats(
                num_running_reqs=_queue_count(st["running"], prio),
                num_queue_reqs=_queue_count(st["waiting"], prio),
                gen_throughput=st["gen_tps"], cache_hit_rate=h / q if q > 0 else 0.0,
                token_usage=st["usage"], full_token_usage=st["usage"],
                num_used_tokens=used, kv_used_tokens=used,
                kv_available_tokens=max(total - used, 0),
                num_retracted_reqs=int(d["preemptions"])))
            if hasattr(col, "increment_realtime_tokens"):
                # the scheduler counts tokens at every prefill and decode iteration
                # (MetricsReporter.report_prefill_stats / report_decode_stats); summed per interval
                col.increment_realtime_tokens(
                    dp_cooperation_info=None, prefill_compute_tokens=max(int(d["prompt_tokens"] - h), 0),
                    prefill_cache_tokens=int(h), decode_tokens=int(d["generation_tokens"]))
        conn.send(i)
    conn.close()


def replay(doc: dict, out_path: str) -> None:
    """One timeline: tokenizer collector here, one forked process per scheduler rank."""
    import multiprocessing as mp

    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    from sglang.srt.observability.metrics_collector import (
        TokenizerMetricsCollector,
        tokenizer_metric_labels,
    )
    from sglang.srt.runtime_context import get_observability, publish

    sa = server_args(doc)
    publish(sa, role="tokenizer")
    obs = get_observability()
    tok = TokenizerMetricsCollector(
        server_args=sa, labels=tokenizer_metric_labels(),
        bucket_time_to_first_token=obs.bucket_time_to_first_token,
        bucket_e2e_request_latency=obs.bucket_e2e_request_latency,
        bucket_inter_token_latency=obs.bucket_inter_token_latency)
    labels = dict(tok.labels)
    if sa.enable_priority_scheduling:
        labels["priority"] = "0"  # per request, as the tokenizer manager sets it
    fork = mp.get_context("fork")
    pipes, procs = [], []
    for rank in range(int(sa.tp_size)):
        parent, child = fork.Pipe()
        p = fork.Process(target=rank_worker, args=(sa, rank, doc, child))
        p.start()
        pipes.append(parent)
        procs.append(p)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    out = Writer(out_path)
    steps = doc["engines"][0]
    for i, step in enumerate(steps):
        for conn in pipes:
            conn.send(i)
        for v in expand(step["obs"]["ttft"]):
            tok.observe_time_to_first_token(labels, v, stream=False)
        for value, count in step["obs"]["itl"]:
            tok.observe_inter_token_latency(labels, float(value) * int(count), int(count))
        recs = finished(step)
        hits = int(step["delta"]["prefix_hits"])
        for k, r in enumerate(recs):
            cached = hits // len(recs) + (1 if k < hits % len(recs) else 0)
            tok.observe_one_finished_request(
                labels, int(r["prompt_tokens"]), int(r["gen_tokens"]),
                min(cached, int(r["prompt_tokens"])), r["e2e"], False,
                time_per_output_token=r["tpot_req"])
        for _ in range(int(step["delta"]["aborted"])):  # client timeouts
            tok.observe_one_aborted_request(tok.labels)
        for conn in pipes:
            conn.recv()
        out.scrape(step["t"], generate_latest(registry))
    for conn in pipes:
        conn.send(None)
    for p in procs:
        p.join(60)
    out.close()


def main() -> int:
    # import once here: every timeline's process is forked from this one
    import sglang.srt.observability.metrics_collector
    import sglang.srt.runtime_context
    import sglang.srt.server_args  # noqa: F401

    replay_each_forked(replay, MULTIPROC)
    shutil.rmtree(MULTIPROC, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
