"""``kvwatch capacity`` CLI: in-process through ``add_parser``, and via the console script."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from support.prom import free_port, unavailable

from kvwatch.tools.capacity.cli import add_parser

CONFIGS = Path(__file__).parent / "fixtures" / "model_configs"
ARTICLE = ["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--kv-dtype", "bf16"]
SMALL = [*ARTICLE, "--max-input", "1k", "--max-output", "1k"]
LIMITS_8 = [*SMALL, "--concurrency", "8"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="kvwatch")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["capacity", *argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_article_numbers_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*ARTICLE, "--max-input", "32k", "--max-output", "2k", "--concurrency", "8"]
    code, out, err = _run([*argv, "--format", "json"], capsys)
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert doc["bytes_per_token"] == 131_072
    assert doc["bytes_per_request"] == 4_563_402_752  # 4.25 GiB
    assert doc["bytes_for_concurrency"] == 36_507_222_016  # 34 GiB
    assert doc["kv_budget_bytes"] is None and doc["max_concurrent_requests"] is None
    assert doc["model"]["layers"] == 32 and doc["model"]["kv_dtype"] == "bf16"
    assert doc["limits"]["tokens_per_request"] == 34_816


def test_article_text_shows_human_units_and_exact_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*ARTICLE, "--max-input", "32768", "--max-output", "2048", "--concurrency", "8"]
    code, out, _ = _run([*argv, "--gpu-memory", "80GiB", "--weights", "16GiB"], capsys)
    assert code == 0
    lines = {
        line.split("  ")[1].strip(): line for line in out.splitlines() if line.startswith("  ")
    }
    assert "128 KiB" in lines["per token"] and "131,072 B" in lines["per token"]
    assert "4.25 GiB" in lines["per request"] and "4,563,402,752 B" in lines["per request"]
    assert "34 GiB" in lines["× 8 concurrent"] and "36,507,222,016 B" in lines["× 8 concurrent"]
    assert "56 GiB" in lines["KV pool"] and "60,129,542,144 B" in lines["KV pool"]
    assert "13  requests fit (8 wanted: fits)" in out


def test_pool_json_and_recommendations(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*ARTICLE, "--max-input", "128K", "--max-output", "2k", "--concurrency", "8"]
    argv += ["--gpu-memory", "80GiB", "--weights", "16GiB", "--format", "json"]
    code, out, _ = _run(argv, capsys)
    doc = json.loads(out)
    assert code == 0
    assert doc["kv_budget_bytes"] == 56 * 1024**3
    assert doc["tokens_fit"] == 458_752
    assert doc["max_concurrent_requests"] == 3 and doc["fits"] is False
    kinds = [r["kind"] for r in doc["recommendations"]]
    assert kinds == [
        "lower_max_context",
        "lower_max_concurrency",
        "kv_quantization_fp8",
        "separate_long_request_pool",
        "more_gpus_tp",
    ]


def test_model_config_with_mla_note(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model-config", str(CONFIGS / "deepseek-v2-lite-mla.json")]
    argv += ["--max-input", "4k", "--max-output", "1k", "--format", "json"]
    code, out, _ = _run(argv, capsys)
    doc = json.loads(out)
    assert code == 0 and doc["bytes_per_token"] == 31_104
    assert doc["model"]["attention"] == "mla"
    assert any(n.startswith("MLA: one latent of kv_lora_rank 512") for n in doc["notes"])


def test_sliding_window_note_in_text(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model-config", str(CONFIGS / "mistral-7b-v0.1-sliding.json")]
    code, out, _ = _run([*argv, "--max-input", "8k", "--max-output", "1k"], capsys)
    assert code == 0
    assert "sliding window 4,096 tokens on 32 of 32 layers" in out
    assert "full-attention worst case" in out


def test_flags_override_model_config(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model-config", str(CONFIGS / "llama-3.1-8b.json"), "--kv-dtype", "fp8"]
    code, out, _ = _run(
        [*argv, "--max-input", "1k", "--max-output", "1k", "--format", "json"], capsys
    )
    assert code == 0 and json.loads(out)["bytes_per_token"] == 65_536


def test_limits_default_to_the_models_max_context(capsys: pytest.CaptureFixture[str]) -> None:
    llama = ["--model-config", str(CONFIGS / "llama-3.1-8b.json"), "--format", "json"]
    code, out, _ = _run([*llama, "--gpu-memory", "80GiB", "--weights", "16GiB"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["limits"]["tokens_per_request"] == 131_072
    assert doc["bytes_per_request"] == 16 * 1024**3  # the article's 128K-token request
    assert doc["max_concurrent_requests"] == 3
    assert any(n.startswith("worst case = the model's max context 131,072") for n in doc["notes"])
    code, out, _ = _run([*llama, "--max-output", "4k"], capsys)
    assert json.loads(out)["limits"] == {
        "max_input": 126_976,
        "max_output": 4_096,
        "concurrency": 1,
        "tokens_per_request": 131_072,
    }
    code, out, _ = _run([*llama, "--max-input", "128k", "--max-output", "4k"], capsys)
    assert any("exceed the model's max context" in n for n in json.loads(out)["notes"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            [*ARTICLE[:-1], "fp12", "--max-input", "1k", "--max-output", "1k"],
            "--kv-dtype: unknown dtype 'fp12' (expected one of bf16, fp16, fp8, int8, int4)",
        ),
        ([*ARTICLE, "--max-output", "1k"], "--max-input: required"),
        (
            ["--model-config", str(CONFIGS / "falcon-7b-mqa.json"), "--max-output", "1k"],
            "--max-input: required (no max_position_embeddings to default from)",
        ),
        (
            ["--model-config", str(CONFIGS / "llama-3.1-8b.json"), "--max-input", "200k"],
            "--max-input: 204,800 exceeds the model's max context 131,072",
        ),
        (
            [*ARTICLE, "--max-input", "0", "--max-output", "1k"],
            "--max-input: must be greater than 0",
        ),
        (
            ["--layers", "32", "--max-input", "1", "--max-output", "1"],
            "--kv-heads: required unless",
        ),
        (
            [*SMALL, "--gpu-memory", "80GiB"],
            "--weights: required with --gpu-memory",
        ),
        (
            [*SMALL, "--gpu-memory", "80GiB", "--weights", "96GiB"],
            "--weights: 96 GiB exceed --gpu-memory 80 GiB × 1 GPU",
        ),
        (
            [*SMALL, "--gpu-memory=-80GiB", "--weights", "16GiB"],
            "--gpu-memory: must be greater than 0",
        ),
        (
            [*SMALL, "--gpu-utilization", "1.5"],
            "--gpu-utilization: must be in (0, 1]",
        ),
        (
            ["--model-config", "/nonexistent/config.json", "--max-input", "1", "--max-output", "1"],
            "--model-config: cannot read '/nonexistent/config.json'",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(argv, capsys)
    assert code == 2 and out == ""
    assert err.startswith(f"kvwatch capacity: {message}")
    assert err.count("\n") == 1


def test_missing_config_key_names_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_attention_heads": 32, "hidden_size": 4096}))
    code, _, err = _run(
        ["--model-config", str(cfg), "--max-input", "1", "--max-output", "1"], capsys
    )
    assert code == 2
    assert err == f"kvwatch capacity: {cfg}: missing key 'num_hidden_layers'\n"


def test_unreachable_prometheus_exits_3_naming_the_url(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = _run([*LIMITS_8, "--prometheus-url", url], capsys)
    assert code == 3 and out == ""
    assert err.startswith(f"kvwatch capacity: Prometheus at {url}")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--window", "soon"], "--window: expected a duration"),
        (["--at", "yesterday"], "--at: expected an RFC 3339 time"),
        (["--selector", "{job=vllm}"], "--selector: "),
    ],
)
def test_bad_prometheus_flags_exit_2_before_any_query(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: a query would exit 3
    code, _, err = _run([*LIMITS_8, "--prometheus-url", url, *extra], capsys)
    assert code == 2
    assert err.startswith(f"kvwatch capacity: {message}") and err.count("\n") == 1


def test_observed_flags_need_a_url(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run([*LIMITS_8, "--window", "30m"], capsys)
    assert code == 2 and err == "kvwatch capacity: --window: needs --prometheus-url\n"


def kvwatch_command() -> str:
    """The ``kvwatch`` console script, once the main CLI registers ``capacity``.

    Until then: skip locally, fail under ``CI`` (a skip must not hide a broken command).
    """
    exe = shutil.which("kvwatch")
    probe = None
    if exe is not None:
        probe = subprocess.run(
            [exe, "capacity", "--help"], capture_output=True, text=True, timeout=60
        )
    if probe is not None and probe.returncode == 0:
        return str(exe)
    why = "no kvwatch console script" if probe is None else probe.stderr.strip()[-300:]
    msg = f"`kvwatch capacity --help` does not work yet: {why}"
    unavailable(msg)
    raise AssertionError("unreachable")


def test_console_script_reproduces_the_article() -> None:
    argv = [kvwatch_command(), "capacity", *ARTICLE, "--max-input", "32k", "--max-output", "2k"]
    done = subprocess.run(
        [*argv, "--concurrency", "8", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["bytes_per_token"], doc["bytes_per_request"], doc["bytes_for_concurrency"]) == (
        131_072,
        4_563_402_752,
        36_507_222_016,
    )
    bad = subprocess.run(
        [*argv[:-4], "--kv-dtype", "fp12"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("kvwatch capacity: --kv-dtype: unknown")
