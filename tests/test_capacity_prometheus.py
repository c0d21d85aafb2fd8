"""``kvwatch capacity --prometheus-url`` against a real Prometheus holding backfilled histograms.

One hour of data ending two hours ago, 15 s apart, is written as OpenMetrics
for a vLLM, an SGLang and a Triton/TensorRT-LLM target and backfilled with
``promtool``. Bucket counters grow linearly, so every quantile lands exactly
on a bucket bound and the expected values are known by hand.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from support.prom import backfill, prometheus
from test_capacity_cli import kvwatch_command

from kvwatch.tools.capacity.cli import add_parser

pytestmark = pytest.mark.prometheus

STEP = 15
END = (int(time.time()) // 3600) * 3600 - 2 * 3600
START = END - 3600
AT = datetime.fromtimestamp(END, tz=UTC).isoformat().replace("+00:00", "Z")
INF = "+Inf"

# cumulative bucket counts added every step: (le, count); the last is +Inf
VLLM_LE = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, INF)
VLLM_PROMPT = (
    0,
    0,
    0,
    0,
    0,
    0,
    2,
    5,
    20,
    50,
    80,
    95,
    99,
    100,
    100,
    100,
)  # p50 1000 p95 5000 p99 10000
VLLM_OUTPUT = (0, 0, 0, 5, 10, 20, 50, 70, 90, 95, 99, 100, 100, 100, 100, 100)  # 100 / 1000 / 2000
SGL_LE = (100, 500, 1000, 2000, 5000, INF)
SGL_PROMPT = (10, 50, 95, 99, 100, 100)  # 500 / 1000 / 2000
SGL_OUTPUT = (50, 95, 99, 100, 100, 100)  # 100 / 500 / 1000
TRT_LE = (10, 50, 100, 500, 1000, INF)
TRT_PROMPT = (0, 10, 50, 95, 99, 100)  # 100 / 500 / 1000
TRT_OUTPUT = (50, 95, 99, 100, 100, 100)  # 10 / 50 / 100


def _labels(**kv: str) -> str:
    return ",".join(f'{k}="{v}"' for k, v in kv.items())


def _histogram(
    name: str, labels: dict[str, str], les: tuple[object, ...], cum: tuple[int, ...]
) -> list[str]:
    lines = [f"# TYPE {name} histogram"]
    for i, ts in enumerate(range(START, END + 1, STEP)):
        for le, c in zip(les, cum, strict=True):
            le_text = INF if le == INF else f"{float(le)}"  # type: ignore[arg-type]
            lines.append(f"{name}_bucket{{{_labels(**labels, le=le_text)}}} {c * i} {ts}")
        lines.append(f"{name}_count{{{_labels(**labels)}}} {cum[-1] * i} {ts}")
        lines.append(f"{name}_sum{{{_labels(**labels)}}} {cum[-1] * i * 100} {ts}")
    return lines


def _gauge(name: str, series: list[tuple[dict[str, str], float]]) -> list[str]:
    lines = [f"# TYPE {name} gauge"]
    for labels, value in series:
        lines += [
            f"{name}{{{_labels(**labels)}}} {value} {ts}" for ts in range(START, END + 1, STEP)
        ]
    return lines


def openmetrics() -> str:
    vllm = {"job": "vllm", "instance": "vllm-0:8000", "model_name": "llama"}
    sgl = {"job": "sglang", "instance": "sgl-0:30000", "model_name": "llama"}
    trt = {"job": "triton", "instance": "trt-0:8002", "model": "tensorrt_llm", "version": "1"}
    info = {"block_size": "16", "cache_dtype": "auto", "engine": "0"}
    lines = [
        *_histogram("vllm:request_prompt_tokens", vllm, VLLM_LE, VLLM_PROMPT),
        *_histogram("vllm:request_generation_tokens", vllm, VLLM_LE, VLLM_OUTPUT),
        *_gauge(
            "vllm:cache_config_info",
            [
                ({"job": "vllm", "instance": "vllm-0:8000", **info, "num_gpu_blocks": "12500"}, 1),
                ({"job": "vllm", "instance": "vllm-1:8000", **info, "num_gpu_blocks": "25000"}, 1),
            ],
        ),
        *_histogram("sglang:prompt_tokens_histogram", sgl, SGL_LE, SGL_PROMPT),
        *_histogram("sglang:generation_tokens_histogram", sgl, SGL_LE, SGL_OUTPUT),
        *_gauge("sglang:max_total_num_tokens", [(sgl, 300000)]),
        *_histogram("nv_llm_input_token_len", trt, TRT_LE, TRT_PROMPT),
        *_histogram("nv_llm_output_token_len", trt, TRT_LE, TRT_OUTPUT),
        *_gauge(
            "nv_trt_llm_kv_cache_block_metrics",
            [
                ({**trt, "kv_cache_block_type": "max"}, 6239),
                ({**trt, "kv_cache_block_type": "tokens_per"}, 64),
            ],
        ),
        "# EOF",
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tsdb = tmp_path_factory.mktemp("capacity-tsdb") / "data"
    backfill(openmetrics(), tsdb)
    with prometheus(tsdb) as url:
        yield url


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict | None, str]:
    parser = argparse.ArgumentParser(prog="kvwatch")
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["capacity", *argv, "--format", "json"])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out else None), err


LLAMA = ["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--kv-dtype", "bf16"]
LIMITS = ["--max-input", "32k", "--max-output", "2k", "--concurrency", "16"]


def test_vllm_quantiles_and_smallest_pool(
    prom_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*LLAMA, *LIMITS, "--prometheus-url", prom_url, "--at", AT, "--window", "30m"]
    code, doc, err = _run([*argv, "--selector", '{job="vllm"}'], capsys)
    assert code == 0, err
    assert doc is not None
    obs = doc["observed"]
    assert obs["engine"] == "vllm"
    assert obs["prompt_tokens"] == {"p50": 1000, "p95": 5000, "p99": 10000}
    assert obs["output_tokens"] == {"p50": 100, "p95": 1000, "p99": 2000}
    assert obs["pool_tokens"] == 12500 * 16  # smallest of two instances
    assert obs["queries"] == 1 + 6 + 1  # detection, one per quantile and histogram, pool
    assert doc["kv_budget_source"] == "engine"
    assert doc["tokens_fit"] == 200_000
    assert doc["kv_budget_bytes"] == 200_000 * 131_072
    assert doc["max_concurrent_requests"] == 200_000 // 34_816 == 5
    rows = {r["label"]: r for r in doc["quantiles"]}
    assert rows["p50"]["tokens_per_request"] == 1_100 and rows["p50"]["requests_fit"] == 181
    assert rows["p99"]["requests_fit"] == 200_000 // 12_000 == 16
    assert rows["p99"]["headroom_requests"] == 0
    assert any("200,000–400,000 tokens; used the smallest" in n for n in doc["notes"])
    kinds = [r["kind"] for r in doc["recommendations"]]
    assert "separate_long_request_pool" in kinds


def test_sglang_selector(prom_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*LLAMA, *LIMITS, "--prometheus-url", prom_url, "--at", AT, "--window", "30m"]
    code, doc, err = _run([*argv, "--selector", 'job="sglang"'], capsys)
    assert code == 0, err
    assert doc is not None
    assert doc["observed"]["engine"] == "sglang"
    assert doc["observed"]["prompt_tokens"] == {"p50": 500, "p95": 1000, "p99": 2000}
    assert doc["observed"]["output_tokens"] == {"p50": 100, "p95": 500, "p99": 1000}
    assert doc["tokens_fit"] == 300_000


def test_triton_pool_is_blocks_times_tokens_per_block(
    prom_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*LLAMA, *LIMITS, "--prometheus-url", prom_url, "--at", AT, "--window", "30m"]
    code, doc, err = _run([*argv, "--selector", '{job="triton"}'], capsys)
    assert code == 0, err
    assert doc is not None
    assert doc["observed"]["engine"] == "trtllm"
    assert doc["observed"]["prompt_tokens"] == {"p50": 100, "p95": 500, "p99": 1000}
    assert doc["observed"]["output_tokens"] == {"p50": 10, "p95": 50, "p99": 100}
    assert doc["tokens_fit"] == 6239 * 64
    assert any("clamped to 1000" in n for n in doc["notes"])


def test_no_selector_picks_the_first_engine_and_says_so(
    prom_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*LLAMA, *LIMITS, "--prometheus-url", prom_url, "--at", AT]
    code, doc, _ = _run(argv, capsys)
    assert code == 0 and doc is not None
    assert doc["observed"]["engine"] == "vllm" and doc["observed"]["window"] == "1h"
    assert any(n.startswith("several engines match") for n in doc["notes"])


def test_nothing_matching_is_a_note_not_a_guess(
    prom_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*LLAMA, *LIMITS, "--prometheus-url", prom_url, "--at", AT, "--selector", '{job="none"}']
    code, doc, _ = _run([*argv, "--gpu-memory", "80GiB", "--weights", "16GiB"], capsys)
    assert code == 0 and doc is not None
    assert doc["observed"]["engine"] is None and doc["quantiles"] == []
    assert doc["kv_budget_source"] == "gpu_memory"
    assert any(n.startswith("no prompt/output length histograms") for n in doc["notes"])


def test_memory_and_engine_pool_are_compared(
    prom_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        *LLAMA,
        *LIMITS,
        "--prometheus-url",
        prom_url,
        "--at",
        AT,
        "--selector",
        '{job="sglang"}',
    ]
    code, doc, _ = _run([*argv, "--gpu-memory", "80GiB", "--weights", "16GiB"], capsys)
    assert code == 0 and doc is not None
    assert doc["kv_budget_source"] == "engine"
    assert "give a pool of 458,752 tokens; the engine reports 300,000 (used)" in " ".join(
        doc["notes"]
    )


def test_console_script_reads_prometheus(prom_url: str) -> None:
    argv = [kvwatch_command(), "capacity", *LLAMA, *LIMITS]
    argv += [
        "--prometheus-url",
        prom_url,
        "--at",
        AT,
        "--window",
        "30m",
        "--selector",
        '{job="vllm"}',
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f'observed at {AT} over 30m (vllm, {{job="vllm"}}, {prom_url}):' in done.stdout
    assert "p99" in done.stdout
    assert "pool tokens" in done.stdout and "200,000" in done.stdout


def test_model_name_selector_joins_the_pool_on_job_and_instance(
    prom_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 13 item 13: the README's ``--selector '{model_name="m"}'`` example.

    ``vllm:cache_config_info`` carries no ``model_name``; the pool is read for the
    job/instance whose length histograms match the selector.
    """
    argv = [*LLAMA, *LIMITS, "--prometheus-url", prom_url, "--at", AT, "--window", "30m"]
    code, doc, err = _run([*argv, "--selector", '{model_name="llama", job="vllm"}'], capsys)
    assert code == 0, err
    assert doc is not None
    obs = doc["observed"]
    assert obs["engine"] == "vllm" and obs["prompt_tokens"]["p50"] == 1000
    assert obs["pool_tokens"] == 12500 * 16  # vllm-0 only: vllm-1 has no matching histograms
    assert "joined on job/instance" in obs["pool_detail"]
    assert doc["kv_budget_source"] == "engine"
