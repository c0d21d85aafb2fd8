"""Render a :class:`~kvwatch.tools.capacity.plan.CapacityPlan` as JSON or as an aligned text report.

Both renderings come from the same plan. JSON sizes are integers in bytes and
counts in tokens or requests; the text report shows human units (KiB/MiB/GiB)
next to the exact byte counts.
"""

from __future__ import annotations

from typing import Any

from kvwatch.tools.capacity.plan import CapacityPlan
from kvwatch.tools.capacity.units import format_bytes


def to_dict(plan: CapacityPlan, observed: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document; ``kv_budget_*``, ``max_concurrent_requests``, ``tokens_fit`` are null without a pool."""
    lim, budget = plan.limits, plan.budget
    return {
        "model": plan.model.to_dict(),
        "limits": {
            "max_input": lim.max_input,
            "max_output": lim.max_output,
            "concurrency": lim.concurrency,
            "tokens_per_request": lim.tokens_per_request,
        },
        "num_gpus": plan.num_gpus,
        "bytes_per_token": plan.bytes_per_token,
        "pool_bytes_per_token": plan.pool_bytes_per_token,
        "bytes_per_request": plan.bytes_per_request,
        "bytes_for_concurrency": plan.bytes_for_concurrency,
        "kv_budget_bytes": budget.bytes if budget else None,
        "kv_budget_source": budget.source if budget else None,
        "kv_budget_detail": budget.detail if budget else None,
        "max_concurrent_requests": plan.max_concurrent_requests,
        "tokens_fit": plan.tokens_fit,
        "fits": plan.fits,
        "observed": observed,
        "quantiles": [row.to_dict() for row in plan.quantiles],
        "notes": list(plan.notes),
        "recommendations": [r.to_dict() for r in plan.recommendations],
    }


def _size_line(label: str, n: int, extra: str = "") -> str:
    line = f"  {label:<18}{format_bytes(n):>12}  {n:>22,} B"
    return f"{line}   {extra}" if extra else line


def _model_line(plan: CapacityPlan) -> str:
    m = plan.model
    bpe = m.kv_dtype.bytes_per_element
    bpe_text = f"{bpe}" if bpe.denominator == 1 else f"{float(bpe)}"
    if m.is_mla:
        shape = f"{m.layers} layers × MLA latent {m.head_dim}"
    else:
        shape = f"{m.kv_factor} (K,V) × {m.layers} layers × {m.kv_heads} KV heads × head_dim {m.head_dim}"
    return f"  {'model':<18}{shape} × {bpe_text} B ({m.kv_dtype.value})"


def to_text(plan: CapacityPlan, observed: dict[str, Any] | None = None) -> str:
    """The human report: geometry, per-token/request/concurrency sizes, pool, fit, quantiles, advice."""
    lim = plan.limits
    lines = [f"KV cache capacity — {plan.model.source}", _model_line(plan)]
    lines.append(_size_line("per token", plan.bytes_per_token))
    tokens = f"{lim.max_input:,} in + {lim.max_output:,} out = {lim.tokens_per_request:,} tokens"
    lines.append(_size_line("per request", plan.bytes_per_request, tokens))
    lines.append(_size_line(f"× {lim.concurrency} concurrent", plan.bytes_for_concurrency))
    if plan.pool_bytes_per_token != plan.bytes_per_token:
        lines.append(
            _size_line("pool per token", plan.pool_bytes_per_token, f"{plan.num_gpus} GPUs")
        )
    if plan.budget is not None:
        b = plan.budget
        lines.append(_size_line("KV pool", b.bytes, b.detail))
        lines.append(f"  {'pool tokens':<18}{b.tokens:>12,}  tokens")
        verdict = (
            "fits"
            if plan.fits
            else f"short by {lim.concurrency - (plan.max_concurrent_requests or 0)}"
        )
        lines.append(
            f"  {'worst case':<18}{plan.max_concurrent_requests:>12,}  requests fit "
            f"({lim.concurrency} wanted: {verdict})"
        )
    else:
        lines.append("  (no pool: pass --gpu-memory and --weights, or --prometheus-url)")
    if observed is not None:
        lines += ["", _observed_header(observed)]
    if plan.quantiles:
        lines.append(
            f"  {'':<5}{'prompt':>9}{'output':>9}{'tokens':>9}{'per request':>13}"
            f"{'fit':>7}{'headroom':>10}{'pool use':>10}"
        )
        for r in plan.quantiles:
            fit = "-" if r.requests_fit is None else f"{r.requests_fit:,}"
            head = "-" if r.headroom_requests is None else f"{r.headroom_requests:+,}"
            use = "-" if r.utilization is None else f"{r.utilization:.0%}"
            lines.append(
                f"  {r.label:<5}{r.prompt_tokens:>9,}{r.output_tokens:>9,}{r.tokens_per_request:>9,}"
                f"{format_bytes(r.bytes_per_request):>13}{fit:>7}{head:>10}{use:>10}"
            )
    if plan.notes:
        lines += ["", "notes:"] + [f"  - {n}" for n in plan.notes]
    if plan.recommendations:
        lines += ["", "recommendations:"]
        lines += [f"  {i}. {r.text}" for i, r in enumerate(plan.recommendations, 1)]
    return "\n".join(lines)


def _observed_header(observed: dict[str, Any]) -> str:
    engine = observed.get("engine") or "no engine found"
    sel = observed.get("selector") or "{}"
    return (
        f"observed at {observed.get('at')} over {observed.get('window')} "
        f"({engine}, {sel}, {observed.get('url')}):"
    )
