"""Capacity math: the seed article's worked numbers, exactly, plus units, pools and advice."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvwatch.tools.capacity import (
    Advice,
    CapacityError,
    KVDtype,
    ModelGeometry,
    RequestLimits,
    budget_from_blocks,
    budget_from_memory,
    bytes_for_concurrency,
    bytes_per_request,
    engine_budget,
    format_bytes,
    kv_bytes_per_token,
    memory_budget,
    parse_size,
    parse_tokens,
    plan_capacity,
    pool_bytes_per_token,
    requests_fit,
)
from kvwatch.tools.capacity.units import GIB, KIB, MIB

ARTICLE = ModelGeometry(layers=32, kv_heads=8, head_dim=128, kv_dtype=KVDtype.BF16)


# --- the article (seed, "知识点 2" and "一个容量规划例子") ---------------------------------


def test_article_bytes_per_token_is_128_kib() -> None:
    assert kv_bytes_per_token(ARTICLE) == 2 * 32 * 8 * 128 * 2 == 131_072 == 128 * KIB


def test_article_128k_token_request_is_16_gib() -> None:
    assert bytes_per_request(kv_bytes_per_token(ARTICLE), 131_072, 0) == 16 * GIB


def test_article_32k_in_2k_out_is_4_25_gib_per_request() -> None:
    per_request = bytes_per_request(kv_bytes_per_token(ARTICLE), 32_768, 2_048)
    assert (32_768 + 2_048) == 34_816
    assert per_request == 4_563_402_752 == int(4.25 * GIB)
    assert format_bytes(per_request) == "4.25 GiB"


def test_article_eight_worst_case_requests_are_34_gib() -> None:
    per_request = bytes_per_request(kv_bytes_per_token(ARTICLE), 32_768, 2_048)
    assert bytes_for_concurrency(per_request, 8) == 34 * GIB == 36_507_222_016
    assert format_bytes(34 * GIB) == "34 GiB"


def test_article_four_128k_requests_are_64_gib() -> None:
    one = bytes_per_request(kv_bytes_per_token(ARTICLE), 131_072, 0)
    assert bytes_for_concurrency(one, 4) == 64 * GIB


def test_article_plan_from_token_strings() -> None:
    limits = RequestLimits(parse_tokens("32k"), parse_tokens("2K"), 8)
    plan = plan_capacity(ARTICLE, limits)
    assert (plan.bytes_per_token, plan.bytes_per_request, plan.bytes_for_concurrency) == (
        128 * KIB,
        int(4.25 * GIB),
        34 * GIB,
    )
    assert plan.budget is None and plan.fits is None and plan.recommendations == ()


# --- dtypes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [("bf16", 131_072), ("fp16", 131_072), ("fp8", 65_536), ("int8", 65_536), ("int4", 32_768)],
)
def test_bytes_per_token_per_dtype(dtype: str, expected: int) -> None:
    model = ModelGeometry(32, 8, 128, KVDtype.parse(dtype))
    assert kv_bytes_per_token(model) == expected


def test_unknown_dtype_is_one_line_naming_the_flag() -> None:
    with pytest.raises(CapacityError) as err:
        KVDtype.parse("fp12")
    assert str(err.value) == (
        "--kv-dtype: unknown dtype 'fp12' (expected one of bf16, fp16, fp8, int8, int4)"
    )


def test_int4_mla_with_odd_latent_rounds_up_to_whole_bytes() -> None:
    # 3 layers × 1 × 3 elements × 0.5 B = 4.5 B → 5 B (a padding nibble)
    model = ModelGeometry(3, 1, 3, KVDtype.INT4, kv_factor=1)
    assert kv_bytes_per_token(model) == 5


@given(
    layers=st.integers(1, 200),
    kv_heads=st.integers(1, 128),
    head_dim=st.integers(1, 512),
    dtype=st.sampled_from(list(KVDtype)),
)
def test_bytes_per_token_is_an_int_matching_the_formula(
    layers: int, kv_heads: int, head_dim: int, dtype: KVDtype
) -> None:
    bpt = kv_bytes_per_token(ModelGeometry(layers, kv_heads, head_dim, dtype))
    assert isinstance(bpt, int)
    assert bpt == 2 * layers * kv_heads * head_dim * dtype.bytes_per_element


# --- units -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * GIB),
        ("16GiB", 16 * GIB),
        ("500MiB", 500 * MIB),
        ("40GB", 40_000_000_000),
        ("1.5GiB", 1536 * MIB),
        ("123456", 123_456),
        ("2TiB", 2 * 1024 * GIB),
        (" 8 gib ", 8 * GIB),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text, "--gpu-memory") == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0GiB", "--gpu-memory: must be greater than 0, got '0GiB'"),
        ("-5GiB", "--gpu-memory: must be greater than 0, got '-5GiB'"),
        ("80G", "--gpu-memory: unknown unit 'G' in '80G'"),
        ("lots", "--gpu-memory: expected a size such as 80GiB"),
    ],
)
def test_parse_size_errors_name_the_flag(text: str, message: str) -> None:
    with pytest.raises(CapacityError) as err:
        parse_size(text, "--gpu-memory")
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("32768", 32_768), ("32k", 32_768), ("128K", 131_072), ("2k", 2_048), ("1M", 1_048_576)],
)
def test_parse_tokens(text: str, expected: int) -> None:
    assert parse_tokens(text, "--max-input") == expected


@pytest.mark.parametrize("text", ["0", "-1", "1.3k", "12q", ""])
def test_parse_tokens_rejects(text: str) -> None:
    with pytest.raises(CapacityError, match=r"^--max-input: "):
        parse_tokens(text, "--max-input")


@given(st.integers(1, 2**50))
def test_format_bytes_round_trips_within_rounding(n: int) -> None:
    value, unit = format_bytes(n).split()
    back = parse_size(f"{value}{unit}")
    assert abs(back - n) <= max(1, n * 0.01)


# --- pools -------------------------------------------------------------------------------


def test_budget_from_memory_80gib_minus_16gib_weights() -> None:
    budget = budget_from_memory(80 * GIB, 16 * GIB, 128 * KIB)
    assert budget.bytes == 56 * GIB  # 80 × 0.9 = 72 GiB usable − 16 GiB
    assert budget.tokens == 458_752
    assert requests_fit(budget.tokens, 34_816) == 13


def test_budget_reserve_and_utilization() -> None:
    budget = budget_from_memory(80 * GIB, 16 * GIB, 128 * KIB, utilization=0.5, reserve=4 * GIB)
    assert budget.bytes == 20 * GIB


def test_weights_larger_than_memory_are_rejected() -> None:
    with pytest.raises(
        CapacityError, match=r"^--weights: 90 GiB exceed --gpu-memory 80 GiB × 1 GPU$"
    ):
        budget_from_memory(80 * GIB, 90 * GIB, 128 * KIB)


def test_weights_leaving_no_budget_are_rejected() -> None:
    with pytest.raises(CapacityError, match=r"^--weights: 75 GiB weights .* leave no KV budget"):
        budget_from_memory(80 * GIB, 75 * GIB, 128 * KIB)


def test_budget_from_engine_blocks() -> None:
    budget = budget_from_blocks(24_188, 16, 128 * KIB)
    assert budget.tokens == 387_008
    assert budget.bytes == 387_008 * 128 * KIB
    assert budget.source == "engine"


def test_tensor_parallel_replicates_mla_latent_and_scarce_kv_heads() -> None:
    mla = ModelGeometry(27, 1, 576, KVDtype.BF16, kv_factor=1)
    assert pool_bytes_per_token(mla, 8) == 8 * kv_bytes_per_token(mla)
    mqa = ModelGeometry(32, 1, 64, KVDtype.BF16)
    assert pool_bytes_per_token(mqa, 4) == 4 * kv_bytes_per_token(mqa)
    assert pool_bytes_per_token(ARTICLE, 8) == kv_bytes_per_token(ARTICLE)
    assert pool_bytes_per_token(ARTICLE, 16) == 2 * kv_bytes_per_token(ARTICLE)


# --- plans and recommendations -----------------------------------------------------------


def _kinds(plan: object) -> list[Advice]:
    return [r.kind for r in plan.recommendations]  # type: ignore[attr-defined]


def test_article_worst_case_fits_on_80gib_and_advice_says_raise() -> None:
    plan = plan_capacity(
        ARTICLE, RequestLimits(2_048, 512, 8), budget_for=memory_budget(80 * GIB, 16 * GIB)
    )
    assert plan.fits is True
    assert plan.max_concurrent_requests == 458_752 // 2_560 == 179
    assert _kinds(plan) == [Advice.RAISE_CONCURRENCY]


def test_128k_context_does_not_fit_and_every_lever_is_offered() -> None:
    limits = RequestLimits(131_072, 2_048, 8)
    plan = plan_capacity(ARTICLE, limits, budget_for=memory_budget(80 * GIB, 16 * GIB))
    assert plan.fits is False
    assert plan.max_concurrent_requests == 3
    assert _kinds(plan) == [
        Advice.LOWER_MAX_CONTEXT,
        Advice.LOWER_CONCURRENCY,
        Advice.KV_QUANTIZATION,
        Advice.SEPARATE_LONG_POOL,
        Advice.MORE_GPUS,
    ]
    texts = {r.kind: r.text for r in plan.recommendations}
    assert "≤ 57,344 tokens per request" in texts[Advice.LOWER_MAX_CONTEXT]
    assert "at 3" in texts[Advice.LOWER_CONCURRENCY]
    assert "128 KiB → 64 KiB): 6 worst-case requests fit" in texts[Advice.KV_QUANTIZATION]
    assert "over 4 GPUs" in texts[Advice.MORE_GPUS]


def test_tight_fit_warns_against_raising_concurrency() -> None:
    # pool 458,752 tokens; 13 × 34,816 = 452,608 = 98.7 %
    plan = plan_capacity(
        ARTICLE, RequestLimits(32_768, 2_048, 13), budget_for=memory_budget(80 * GIB, 16 * GIB)
    )
    assert plan.fits is True
    assert _kinds(plan) == [Advice.LOWER_CONCURRENCY]
    assert "99%" in plan.recommendations[0].text


def test_observed_quantiles_give_headroom_and_a_long_request_pool() -> None:
    limits = RequestLimits(32_768, 2_048, 16)
    budget_for = engine_budget(200_000, ARTICLE, 1, "vllm kv_cache_size_tokens")
    prompt = {0.5: 1_000, 0.95: 5_000, 0.99: 10_000}
    output = {0.5: 100, 0.95: 1_000, 0.99: 2_000}
    plan = plan_capacity(ARTICLE, limits, budget_for=budget_for, observed=(prompt, output))
    assert plan.max_concurrent_requests == 5 and plan.fits is False
    rows = {r.label: r for r in plan.quantiles}
    assert (rows["p50"].tokens_per_request, rows["p50"].requests_fit) == (1_100, 181)
    assert (rows["p95"].requests_fit, rows["p95"].headroom_requests) == (33, 17)
    assert rows["p99"].requests_fit == 16 and rows["p99"].headroom_requests == 0
    assert rows["p99"].utilization == round(16 * 12_000 / 200_000, 4)
    assert rows["p50"].bytes_per_request == 1_100 * 128 * KIB
    long_pool = next(r for r in plan.recommendations if r.kind is Advice.SEPARATE_LONG_POOL)
    assert "observed p99 (12,000 tokens)" in long_pool.text
    more = next(r for r in plan.recommendations if r.kind is Advice.MORE_GPUS)
    assert "2.8× its 200,000 tokens (557,056 for the worst case)" in more.text


def test_engine_pool_resized_for_fp8_keeps_the_bytes() -> None:
    budget_for = engine_budget(100_000, ARTICLE, 1, "pool")
    fp8 = ModelGeometry(32, 8, 128, KVDtype.FP8)
    assert budget_for(fp8, 1).tokens == 200_000  # type: ignore[union-attr]
    assert budget_for(ARTICLE, 2) is None


def test_request_limits_reject_zero() -> None:
    with pytest.raises(CapacityError, match=r"^--concurrency: must be greater than 0$"):
        RequestLimits(1, 1, 0)
