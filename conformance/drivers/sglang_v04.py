"""SGLang 0.4.x: replay a timeline through ``sglang/srt/metrics/collector.py`` of that release.

Run inside a venv holding SGLang 0.4 (the package alone, without its ``[srt]`` runtime:
torch and the kernels are not needed): ``python sglang_v04.py TIMELINE.json SCRAPES.jsonl``.
The package root cannot import without its runtime, so the collector module is loaded
by path; its one import (``sglang.srt.utils.get_bool_env_var``) is given a stand-in that
reads the environment the same way. The collectors are built with the labels the 0.4
scheduler and tokenizer manager give them, fed what those compute (token usage rounded
to 2 decimals, the mean queue latency of newly scheduled requests, the cumulative
retraction count stored in a gauge) and served as SGLang serves them (multiprocess mode).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
MULTIPROC = tempfile.mkdtemp(prefix="kvwatch-sglang04-prom-")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = MULTIPROC  # before prometheus_client is imported

from common import Writer, expand, finished, replay_each_forked  # noqa: E402


def _collector_module() -> types.ModuleType:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("sglang is not installed in this venv")
    path = Path(next(iter(spec.submodule_search_locations))) / "srt" / "metrics" / "collector.py"
    utils = types.ModuleType("sglang.srt.utils")

    def get_bool_env_var(name: str, default: str = "false") -> bool:
        return os.getenv(name, default).lower() in ("true", "1")

    utils.get_bool_env_var = get_bool_env_var  # type: ignore[attr-defined]
    for name in ("sglang", "sglang.srt"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["sglang.srt.utils"] = utils
    mod_spec = importlib.util.spec_from_file_location("sglang_collector_by_path", path)
    assert mod_spec is not None and mod_spec.loader is not None
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def replay(doc: dict, out_path: str) -> None:
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    col = _collector_module()
    model = doc["target"]["model_name"]
    sched = col.SchedulerMetricsCollector(labels={
        "model_name": model, "engine_type": "unified", "tp_rank": 0, "pp_rank": 0})
    tok = col.TokenizerMetricsCollector(labels={"model_name": model})
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    cfg = doc["config"]
    bs = int(cfg["block_size"])
    retracted = 0
    out = Writer(out_path)
    for step in doc["engines"][0]:
        st, d, obs = step["state"], step["delta"], step["obs"]
        retracted += int(d["preemptions"])
        queue = expand(obs["queue"])
        q, h = d["prefix_queries"], d["prefix_hits"]
        sched.log_stats(col.SchedulerStats(
            num_running_reqs=int(st["running"]), num_used_tokens=round(st["used_blocks"] * bs),
            token_usage=round(st["usage"], 2), gen_throughput=st["gen_tps"],
            num_queue_reqs=int(st["waiting"]), cache_hit_rate=h / q if q > 0 else 0.0,
            avg_request_queue_latency=sum(queue) / len(queue) if queue else 0.0,
            total_retracted_reqs=retracted))
        for v in expand(obs["ttft"]):
            tok.observe_time_to_first_token(v)
        for value, count in obs["itl"]:
            tok.observe_inter_token_latency(float(value) * int(count), int(count))
        recs = finished(step)
        for k, r in enumerate(recs):
            cached = int(h) // len(recs) + (1 if k < int(h) % len(recs) else 0)
            tok.observe_one_finished_request(int(r["prompt_tokens"]), int(r["gen_tokens"]),
                                             min(cached, int(r["prompt_tokens"])), r["e2e"],
                                             False)
        for _ in range(int(d["aborted"])):  # client timeouts
            tok.observe_one_aborted_request()
        out.scrape(step["t"], generate_latest(registry))
    out.close()


def main() -> int:
    replay_each_forked(replay, MULTIPROC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
