"""A vectorised synthetic fleet in OpenMetrics, with the engines' real metric names.

Fast enough for thousands of targets: per metric family one numpy matrix
(targets × samples) is formatted in one pass. Each target gets a dialect
(vLLM V1 new/old KV name, SGLang ``sglang:``/``sglang_``, trtllm-serve) and a
behaviour (healthy, full, oscillating, idle) that drives KV usage, queue,
preemptions and latency histograms. Shards are independent files so promtool
can backfill them in parallel (Prometheus accepts overlapping blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BEHAVIOURS = ("healthy", "full", "oscillating", "idle")
LAT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class Fam:
    """One family: OM type, sample suffix → value function of the target state."""

    name: str
    kind: str  # gauge | counter | histogram
    labels: str = ""  # extra labels, rendered as ',k="v"'


@dataclass(frozen=True)
class DialectSpec:
    id: str
    kv: str
    running: str
    waiting: str
    preempt: tuple[str, str]  # (family, kind): counter or gauge
    gen: str
    req: str
    hists: tuple[str, ...]  # TTFT, queue, ITL
    model_label: str = "model_name"
    static: tuple[tuple[str, str, float], ...] = ()  # (family, labels, value)


_V1 = ("vllm:time_to_first_token_seconds", "vllm:request_queue_time_seconds", "vllm:inter_token_latency_seconds")
DIALECTS: tuple[DialectSpec, ...] = (
    DialectSpec(
        "vllm-v1", "vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
        ("vllm:num_preemptions", "counter"), "vllm:generation_tokens", "vllm:request_success", _V1,
        static=(("vllm:cache_config_info", 'block_size="16",num_gpu_blocks="4096",kv_cache_size_tokens="65536"', 1.0),),
    ),
    DialectSpec(
        "vllm-v1-old", "vllm:gpu_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
        ("vllm:num_preemptions", "counter"), "vllm:generation_tokens", "vllm:request_success",
        ("vllm:time_to_first_token_seconds", "vllm:request_queue_time_seconds", "vllm:time_per_output_token_seconds"),
        static=(("vllm:cache_config_info", 'block_size="16",num_gpu_blocks="4096"', 1.0),),
    ),
    DialectSpec(
        "sglang", "sglang:token_usage", "sglang:num_running_reqs", "sglang:num_queue_reqs",
        ("sglang:num_retracted_requests", "counter"), "sglang:generation_tokens", "sglang:num_requests",
        ("sglang:time_to_first_token_seconds", "sglang:queue_time_seconds", "sglang:inter_token_latency_seconds"),
        static=(("sglang:max_total_num_tokens", "", 65536.0),),
    ),
    DialectSpec(
        "sglang-ray", "ray_sglang_token_usage", "ray_sglang_num_running_reqs", "ray_sglang_num_queue_reqs",
        ("ray_sglang_num_retracted_requests", "counter"), "ray_sglang_generation_tokens", "ray_sglang_num_requests",
        ("ray_sglang_time_to_first_token_seconds", "ray_sglang_queue_time_seconds",
         "ray_sglang_inter_token_latency_seconds"),
        static=(("ray_sglang_max_total_num_tokens", "", 65536.0),),
    ),
    DialectSpec(
        "trtllm-serve", "trtllm_kv_cache_utilization", "trtllm_num_requests_running", "trtllm_num_requests_waiting",
        ("trtllm_num_paused_requests", "gauge"), "trtllm_generation_tokens", "trtllm_request_success",
        ("trtllm_time_to_first_token_seconds", "trtllm_request_queue_time_seconds", "trtllm_time_per_output_token_seconds"),
        model_label="",
        static=(("trtllm_kv_cache_max_blocks", "", 2048.0), ("trtllm_kv_cache_tokens_per_block", "", 32.0),
                ("trtllm_max_num_active_requests", "", 64.0), ("trtllm_iteration_latency_seconds", "", 0.03)),
    ),
)


def _behaviour_kv(b: np.ndarray, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """KV usage (targets × samples) per behaviour index."""
    n, m = len(b), len(t)
    phase = rng.uniform(0, 2 * np.pi, (n, 1))
    noise = rng.normal(0, 0.02, (n, m))
    kv = np.empty((n, m))
    kv[:] = 0.65
    kv[b == 1] = 0.97
    osc = np.sin(2 * np.pi * t[None, :] / 480.0 + phase)
    kv = np.where((b == 2)[:, None], 0.575 + 0.375 * osc, kv)
    kv[b == 3] = 0.04
    return np.clip(kv + noise, 0.0, 1.0)


def _fmt(name: str, labels: list[str], vals: np.ndarray, ts: list[str], decimals: int) -> list[str]:
    """Lines ``name{labels} value ts`` for a (targets × samples) matrix."""
    out: list[str] = []
    rounded = np.round(vals, decimals).tolist()
    for lab, row in zip(labels, rounded, strict=True):
        pre = f"{name}{{{lab}}} "
        out.extend([f"{pre}{v} {s}" for v, s in zip(row, ts, strict=True)])
    return out


def write_shard(path: Path, first: int, count: int, start_s: int, samples: int, step_s: int, seed: int = 7) -> int:
    """Write targets ``first .. first+count-1`` as one OpenMetrics file; returns the sample count."""
    rng = np.random.default_rng(seed + first)
    t = np.arange(samples, dtype=float) * step_s
    ts = [str(start_s + int(x)) for x in t]
    idx = np.arange(first, first + count)
    dialect = idx % len(DIALECTS)
    beh = (idx // len(DIALECTS)) % len(BEHAVIOURS)
    kv = _behaviour_kv(beh, t, rng)
    running = np.round(np.where(beh[:, None] == 3, 1, 8 + 24 * kv))
    waiting = np.where((beh == 1)[:, None], 5.0 + rng.integers(0, 3, (count, samples)), 0.0)
    preempt_rate = np.where(beh == 1, 0.5, 0.0)[:, None]
    req_rate = np.where(beh == 3, 0.05, 2.0)[:, None]
    tcum = t[None, :] + step_s
    fams: dict[str, tuple[str, list[str]]] = {}
    nsamples = 0

    def add(fam: str, kind: str, sample: str, labels: list[str], vals: np.ndarray, decimals: int = 4) -> None:
        nonlocal nsamples
        fams.setdefault(fam, (kind, []))[1].extend(_fmt(sample, labels, vals, ts, decimals))
        nsamples += vals.size

    for di, d in enumerate(DIALECTS):
        sel = dialect == di
        if not sel.any():
            continue
        ids = idx[sel]
        # replica groups (job, model) share one behaviour, so imbalance rules stay out of the way
        model = f',{d.model_label}="llama-{{}}"' if d.model_label else ""
        base = [f'job="bench-{d.id}",instance="10.{i // 65536}.{i // 256 % 256}.{i % 256}:8000"'
                + model.format(f"{BEHAVIOURS[(i // len(DIALECTS)) % len(BEHAVIOURS)]}-{i % 3}") for i in ids]
        k, r, w = kv[sel], running[sel], waiting[sel]
        add(d.kv, "gauge", d.kv, base, k)
        add(d.running, "gauge", d.running, base, r, 0)
        add(d.waiting, "gauge", d.waiting, base, w, 0)
        pfam, pkind = d.preempt
        if pkind == "counter":
            add(pfam, "counter", f"{pfam}_total", base, np.floor(preempt_rate[sel] * tcum), 0)
        else:
            add(pfam, "gauge", pfam, base, np.where(preempt_rate[sel] > 0, 1.0, 0.0) * np.ones_like(k), 0)
        add(d.gen, "counter", f"{d.gen}_total", base, np.floor(40 * r * tcum / 10), 0)
        stops = [f'{b},finished_reason="stop"' for b in base] if d.req.startswith("vllm") else base
        add(d.req, "counter", f"{d.req}_total", stops, np.floor(req_rate[sel] * tcum), 0)
        cnt = np.floor(req_rate[sel] * tcum)
        for h, hist in enumerate(d.hists):
            # slower latencies when full: shift the distribution up one bucket
            shift = np.where(beh[sel] == 1, 1, 0)
            for j, le in enumerate((*LAT_BUCKETS, float("inf"))):
                share = np.clip(0.15 + 0.2 * (j - shift - h % 2), 0.0, 1.0)[:, None]
                le_s = "+Inf" if le == float("inf") else repr(le)
                add(hist, "histogram", f"{hist}_bucket", [f'{b},le="{le_s}"' for b in base],
                    np.floor(cnt * (1.0 if le == float("inf") else share)), 0)
            add(hist, "histogram", f"{hist}_count", base, cnt, 0)
            add(hist, "histogram", f"{hist}_sum", base, cnt * 0.4, 3)
        for fam, extra, value in d.static:
            labs = [f"{b},{extra}" if extra else b for b in base]
            add(fam, "gauge", fam, labs, np.full_like(k, value), 0)
    with path.open("w") as fh:
        for fam, (kind, lines) in fams.items():
            fh.write(f"# TYPE {fam} {kind}\n")
            fh.write("\n".join(lines))
            fh.write("\n")
        fh.write("# EOF\n")
    return nsamples


def shards(total: int, parts: int) -> list[tuple[int, int]]:
    """(first, count) splits of ``total`` targets into ``parts`` nearly equal shards."""
    size = -(-total // parts)
    return [(a, min(size, total - a)) for a in range(0, total, size)]


Writer = Callable[[Path, int, int, int, int, int], int]
