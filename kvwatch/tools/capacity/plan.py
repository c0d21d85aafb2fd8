"""A capacity plan: the numbers for one model, admission limits and KV pool, plus advice.

:func:`plan_capacity` is pure: geometry, limits, an optional pool
(:class:`~kvwatch.tools.capacity.math.KVBudget`) and optional observed length
quantiles in, a frozen :class:`CapacityPlan` out. Recommendations are chosen
from the numbers, in the article's order (cheapest and most stable first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum

from kvwatch.tools.capacity.math import (
    BudgetFor,
    KVBudget,
    QuantileRow,
    RequestLimits,
    bytes_for_concurrency,
    bytes_per_request,
    kv_bytes_per_token,
    pool_bytes_per_token,
    quantile_rows,
    requests_fit,
)
from kvwatch.tools.capacity.model import KVDtype, ModelGeometry
from kvwatch.tools.capacity.units import format_bytes

#: A worst-case request above this share of the pool is worth its own pool.
LONG_REQUEST_POOL_SHARE = 0.10
#: Worst-case load above this share of the pool leaves too little slack.
TIGHT_POOL_SHARE = 0.90
#: Largest tensor-parallel size (a power of two) the "more GPUs" advice tries.
MAX_GPUS = 64


class Advice(StrEnum):
    """Kinds of recommendation; the value is the JSON ``kind``."""

    LOWER_MAX_CONTEXT = "lower_max_context"
    LOWER_CONCURRENCY = "lower_max_concurrency"
    KV_QUANTIZATION = "kv_quantization_fp8"
    SEPARATE_LONG_POOL = "separate_long_request_pool"
    MORE_GPUS = "more_gpus_tp"
    RAISE_CONCURRENCY = "raise_max_concurrency"


@dataclass(frozen=True)
class Recommendation:
    kind: Advice
    text: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind.value, "text": self.text}


@dataclass(frozen=True)
class CapacityPlan:
    """All capacity figures (bytes and tokens, ``int``); pool-dependent ones are ``None`` without a pool."""

    model: ModelGeometry
    limits: RequestLimits
    num_gpus: int
    bytes_per_token: int
    pool_bytes_per_token: int
    bytes_per_request: int
    bytes_for_concurrency: int
    budget: KVBudget | None
    max_concurrent_requests: int | None
    tokens_fit: int | None
    quantiles: tuple[QuantileRow, ...] = ()
    notes: tuple[str, ...] = ()
    recommendations: tuple[Recommendation, ...] = field(default=())

    @property
    def fits(self) -> bool | None:
        """Whether ``concurrency`` worst-case requests fit in the pool (``None`` without a pool)."""
        if self.max_concurrent_requests is None:
            return None
        return self.max_concurrent_requests >= self.limits.concurrency


def plan_capacity(
    model: ModelGeometry,
    limits: RequestLimits,
    *,
    num_gpus: int = 1,
    budget_for: BudgetFor | None = None,
    observed: tuple[dict[float, int], dict[float, int]] | None = None,
    notes: tuple[str, ...] = (),
) -> CapacityPlan:
    """Compute the plan. ``budget_for(model, num_gpus)`` yields the pool (or ``None``)."""
    bpt = kv_bytes_per_token(model)
    pool_bpt = pool_bytes_per_token(model, num_gpus)
    per_request = bytes_per_request(bpt, limits.max_input, limits.max_output)
    budget = budget_for(model, num_gpus) if budget_for else None
    all_notes = [*model.notes, *notes, *_model_notes(model, num_gpus, bpt, pool_bpt)]
    fit = requests_fit(budget.tokens, limits.tokens_per_request) if budget else None
    rows = quantile_rows(*observed, bpt, limits.concurrency, budget) if observed else ()
    plan = CapacityPlan(
        model=model,
        limits=limits,
        num_gpus=num_gpus,
        bytes_per_token=bpt,
        pool_bytes_per_token=pool_bpt,
        bytes_per_request=per_request,
        bytes_for_concurrency=bytes_for_concurrency(per_request, limits.concurrency),
        budget=budget,
        max_concurrent_requests=fit,
        tokens_fit=budget.tokens if budget else None,
        quantiles=rows,
        notes=tuple(all_notes),
    )
    if budget is None or budget_for is None:
        return plan
    return replace(plan, recommendations=tuple(_recommend(plan, budget_for)))


def _model_notes(model: ModelGeometry, num_gpus: int, bpt: int, pool_bpt: int) -> list[str]:
    notes = []
    if model.is_mla:
        notes.append(
            f"MLA: one latent of kv_lora_rank {model.kv_lora_rank} + qk_rope_head_dim "
            f"{model.qk_rope_head_dim} = {model.head_dim} elements per token per layer (no separate K and V)"
        )
    if model.sliding_window:
        layers = model.sliding_layers if model.sliding_layers is not None else model.layers
        notes.append(
            f"sliding window {model.sliding_window:,} tokens on {layers} of {model.layers} layers: "
            "tokens beyond the window are not cached there; figures are the full-attention worst case"
        )
    if model.kv_dtype.bytes_per_element < 1:
        notes.append("int4 KV: two elements per byte; bytes per token rounded up to a whole byte")
    if pool_bpt != bpt:
        why = "the MLA latent is stored on every GPU" if model.is_mla else "KV heads are replicated"
        notes.append(
            f"{num_gpus} GPUs: {why}, so one token takes {format_bytes(pool_bpt)} "
            f"({pool_bpt:,} B) of the instance's pool"
        )
    return notes


def _recommend(plan: CapacityPlan, budget_for: BudgetFor) -> list[Recommendation]:
    """Advice from the numbers: nothing to fix, slack to use, or the ways to make the worst case fit."""
    assert plan.budget is not None and plan.max_concurrent_requests is not None
    lim, pool, fit = plan.limits, plan.budget.tokens, plan.max_concurrent_requests
    need = lim.tokens_per_request * lim.concurrency
    out: list[Recommendation] = []

    def add(kind: Advice, text: str) -> None:
        out.append(Recommendation(kind, text))

    if plan.fits:
        if need > TIGHT_POOL_SHARE * pool:
            add(
                Advice.LOWER_CONCURRENCY,
                (
                    f"{lim.concurrency} worst-case requests fill {need / pool:.0%} of the pool: do not "
                    "raise max concurrency; no slack is left for block rounding or prefix cache"
                ),
            )
        elif fit >= 2 * lim.concurrency:
            add(
                Advice.RAISE_CONCURRENCY,
                (
                    f"the pool holds {fit} worst-case requests: max concurrency can rise from "
                    f"{lim.concurrency} to {fit} before KV becomes the limit"
                ),
            )
        return out
    per_request = pool // lim.concurrency
    text = (
        f"lower max context to ≤ {per_request:,} tokens per request to hold {lim.concurrency} "
        f"concurrent worst-case requests (now {lim.tokens_per_request:,})"
    )
    if per_request > lim.max_output:
        text += (
            f", e.g. max input {per_request - lim.max_output:,} with max output {lim.max_output:,}"
        )
    add(Advice.LOWER_MAX_CONTEXT, text)
    if fit >= 1:
        add(
            Advice.LOWER_CONCURRENCY,
            (
                f"cap max concurrency (max_num_seqs) at {fit}: that many worst-case requests "
                f"({format_bytes(plan.bytes_per_request)} each) fit in {format_bytes(plan.budget.bytes)}"
            ),
        )
    fp8 = replace(plan.model, kv_dtype=KVDtype.FP8)
    fp8_budget = (
        budget_for(fp8, plan.num_gpus) if plan.model.kv_dtype.bytes_per_element > 1 else None
    )
    if fp8_budget is not None:
        add(
            Advice.KV_QUANTIZATION,
            (
                f"fp8 KV cache halves bytes per token ({format_bytes(plan.bytes_per_token)} → "
                f"{format_bytes(kv_bytes_per_token(fp8))}): "
                f"{requests_fit(fp8_budget.tokens, lim.tokens_per_request)} worst-case requests fit; "
                "evaluate quality (long context, code, math) before rollout"
            ),
        )
    long_pool = _long_pool(plan)
    if long_pool:
        add(Advice.SEPARATE_LONG_POOL, long_pool)
    out.append(_more_gpus(plan, budget_for, need))
    return out


def _long_pool(plan: CapacityPlan) -> str:
    """Why long requests deserve their own pool ('' if the numbers do not say so)."""
    lim, pool = plan.limits, plan.tokens_fit or 0
    p99 = next((r for r in plan.quantiles if r.quantile == 0.99), None)
    if p99 is not None and p99.requests_fit is not None:
        if p99.requests_fit < lim.concurrency:
            return ""
        return (
            f"route requests longer than the observed p99 ({p99.tokens_per_request:,} tokens) to a "
            f"separate long-context pool: at p99 length {p99.requests_fit} requests fit, "
            f"{lim.concurrency} needed"
        )
    share = lim.tokens_per_request / pool if pool else math.inf
    if share < LONG_REQUEST_POOL_SHARE:
        return ""
    return (
        f"one worst-case request takes {min(share, 1):.0%} of the pool: route long-context "
        "requests to a separate pool so they cannot starve short ones"
    )


def _more_gpus(plan: CapacityPlan, budget_for: BudgetFor, need: int) -> Recommendation:
    """Smallest power-of-two TP size that holds the worst case (memory pools), else the growth factor."""
    assert plan.budget is not None
    lim = plan.limits
    if plan.budget.source != "gpu_memory":
        text = (
            f"the pool needs {need / plan.budget.tokens:.1f}× its {plan.budget.tokens:,} tokens "
            f"({need:,} for the worst case): more GPUs / tensor parallelism or more replicas"
        )
        return Recommendation(Advice.MORE_GPUS, text)
    for n in (2**k for k in range(1, MAX_GPUS.bit_length()) if 2**k > plan.num_gpus):
        b = budget_for(plan.model, n)
        if b is not None and requests_fit(b.tokens, lim.tokens_per_request) >= lim.concurrency:
            text = (
                f"tensor parallel over {n} GPUs (now {plan.num_gpus}) gives a {format_bytes(b.bytes)} "
                f"pool: {lim.concurrency} worst-case requests fit"
            )
            return Recommendation(Advice.MORE_GPUS, text)
    text = f"even {MAX_GPUS} GPUs do not hold {lim.concurrency} worst-case requests"
    return Recommendation(Advice.MORE_GPUS, text)
