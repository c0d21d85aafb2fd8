"""A small phase-schedule generator of vLLM (V1, 0.10 names) history as OpenMetrics for promtool backfill.

Used by the backtest tests and benchmark to build known ground truth (which
phase each target was in, when) without the full simulator. Each target follows
a schedule of ``(seconds, profile)`` phases; a profile fixes the levels of KV
usage, queue, preemption rate and TTFT, with small deterministic noise. Counters
and histograms are cumulative, as a real engine exports them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvwatch.core.models import FailureMode


@dataclass(frozen=True)
class Profile:
    """Levels of one phase: KV ratio, requests running/waiting, preemptions/s, finished requests/s, TTFT s."""

    mode: FailureMode
    kv: float
    kv_noise: float
    running: float
    waiting: float
    preempt_rate: float
    request_rate: float
    ttft: float


PROFILES: dict[str, Profile] = {
    "healthy-busy": Profile(FailureMode.HEALTHY, 0.70, 0.03, 30, 0, 0.0, 4.0, 0.2),
    "full": Profile(FailureMode.FULL, 0.97, 0.01, 45, 6, 0.5, 4.0, 1.5),
    "idle": Profile(FailureMode.IDLE, 0.05, 0.01, 1, 0, 0.0, 0.2, 0.1),
}

Phase = tuple[float, str]  # (duration in seconds, profile name)

_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0)
_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass(frozen=True)
class SynthTarget:
    instance: str
    schedule: tuple[Phase, ...]
    job: str = "vllm"
    seed: int = 0

    def expected(self, start: float) -> list[tuple[float, float, FailureMode]]:
        """Ground truth: ``(from, to, mode)`` per phase, Unix seconds."""
        out, t = [], start
        for dur, name in self.schedule:
            out.append((t, t + dur, PROFILES[name].mode))
            t += dur
        return out


def _levels(target: SynthTarget, ts: np.ndarray, start: float) -> dict[str, np.ndarray]:
    """Per-sample levels of every profile field along the schedule (the last phase extends to the end)."""
    rng = np.random.default_rng(target.seed)
    bounds = np.cumsum([d for d, _ in target.schedule]) + start
    idx = np.minimum(np.searchsorted(bounds, ts, side="right"), len(target.schedule) - 1)
    profs = [PROFILES[name] for _, name in target.schedule]

    def field(name: str) -> np.ndarray:
        return np.array([getattr(p, name) for p in profs])[idx]

    kv = np.clip(field("kv") + rng.normal(0, 1, len(ts)) * field("kv_noise"), 0, 1)
    return {
        "kv": kv,
        "running": np.round(field("running") + rng.integers(-2, 3, len(ts)) * (field("running") > 2)),
        "waiting": field("waiting"),
        "preempt_rate": field("preempt_rate"),
        "request_rate": field("request_rate"),
        "ttft": field("ttft"),
    }


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def _target_lines(t: SynthTarget, ts: np.ndarray, start: float, interval: float, only: str) -> list[str]:
    """The sample lines of family ``only`` for one target (one family at a time bounds memory)."""
    lv = _levels(t, ts, start)
    base = f'job="{t.job}",instance="{t.instance}"'
    lab = f'{base},model_name="{_MODEL}",engine="0"'
    n = np.cumsum(lv["request_rate"] * interval)  # finished requests so far
    stamps = [int(x) for x in ts]
    if only == "ttft":
        # all requests of a phase land in the first bucket ≥ its TTFT: the quantiles read that bucket
        buckets = [(_fmt(le), np.cumsum(lv["request_rate"] * interval * (lv["ttft"] <= le))) for le in _BUCKETS]
        buckets.append(("+Inf", n))
        ttft_sum = np.cumsum(lv["request_rate"] * interval * lv["ttft"])
        out: list[str] = []
        for i, s in enumerate(stamps):
            out.extend(f'vllm:time_to_first_token_seconds_bucket{{{lab},le="{le}"}} {_fmt(round(c[i]))} {s}'
                       for le, c in buckets)
            out.append(f"vllm:time_to_first_token_seconds_count{{{lab}}} {_fmt(round(n[i]))} {s}")
            out.append(f"vllm:time_to_first_token_seconds_sum{{{lab}}} {_fmt(ttft_sum[i])} {s}")
        return out
    if only == "info":
        return [f'vllm:cache_config_info{{{base},block_size="16",num_gpu_blocks="12500"}} 1 {s}' for s in stamps]
    series, values = {
        "kv": ("vllm:kv_cache_usage_perc", lv["kv"]),
        "run": ("vllm:num_requests_running", lv["running"]),
        "wait": ("vllm:num_requests_waiting", lv["waiting"]),
        "pre": ("vllm:num_preemptions_total", np.round(np.cumsum(lv["preempt_rate"] * interval))),
        "gen": ("vllm:generation_tokens_total", np.round(n * 300)),
        "prompt": ("vllm:prompt_tokens_total", np.round(n * 1000)),
        "succ": ('vllm:request_success_total', np.round(n)),
    }[only]
    labels = f'{lab},finished_reason="stop"' if only == "succ" else lab
    return [f"{series}{{{labels}}} {_fmt(v)} {s}" for v, s in zip(values, stamps, strict=True)]


_TYPES = {
    "kv": ("vllm:kv_cache_usage_perc", "gauge"),
    "run": ("vllm:num_requests_running", "gauge"),
    "wait": ("vllm:num_requests_waiting", "gauge"),
    "pre": ("vllm:num_preemptions", "counter"),
    "gen": ("vllm:generation_tokens", "counter"),
    "prompt": ("vllm:prompt_tokens", "counter"),
    "succ": ("vllm:request_success", "counter"),
    "ttft": ("vllm:time_to_first_token_seconds", "histogram"),
    "info": ("vllm:cache_config_info", "gauge"),
}


def openmetrics(targets: Sequence[SynthTarget], start: float, end: float, interval: float = 15.0) -> Iterator[str]:
    """OpenMetrics lines (families contiguous, ``# EOF`` last) for samples every ``interval`` in [start, end]."""
    ts = np.arange(start, end + interval / 2, interval)
    for key, (name, typ) in _TYPES.items():
        yield f"# TYPE {name} {typ}"
        for t in targets:
            yield from _target_lines(t, ts, start, interval, key)
    yield "# EOF"


def write_openmetrics(path: Path, targets: Sequence[SynthTarget], start: float, end: float, interval: float = 15.0) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for line in openmetrics(targets, start, end, interval):
            fh.write(line + "\n")
    return path
