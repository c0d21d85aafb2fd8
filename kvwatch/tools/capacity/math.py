"""Pure KV-cache capacity math (the article's formula). No I/O.

Units: bytes and tokens, always ``int``. Per-token bytes are rounded *up* to a
whole byte (only reachable with int4 MLA latents of odd width: packed int4 needs
a padding nibble); pools are rounded *down* (a partial token or request does
not fit). Worst case = every request at ``max_input + max_output`` tokens.

``num_gpus`` is the tensor-parallel size of one engine instance: memory adds
up, weights are split, and KV heads are split across GPUs, except that a GPU
keeps at least one KV head (heads are replicated when ``kv_heads < num_gpus``)
and an MLA latent is replicated on every GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from kvwatch.tools.capacity.model import ModelGeometry
from kvwatch.tools.capacity.units import CapacityError, format_bytes

#: The quantiles read from the engine's length histograms.
QUANTILES: tuple[float, ...] = (0.5, 0.95, 0.99)


def kv_bytes_per_token(model: ModelGeometry) -> int:
    """``kv_factor × layers × kv_heads × head_dim × bytes_per_element`` bytes, rounded up."""
    return math.ceil(model.elements_per_token * model.kv_dtype.bytes_per_element)


def stored_kv_heads(model: ModelGeometry, num_gpus: int = 1) -> int:
    """KV heads held over all ``num_gpus`` GPUs (replication included), per layer."""
    if model.is_mla:
        return model.kv_heads * num_gpus
    return max(model.kv_heads, num_gpus)


def pool_bytes_per_token(model: ModelGeometry, num_gpus: int = 1) -> int:
    """Bytes one token costs summed over all GPUs of the instance (>= :func:`kv_bytes_per_token`)."""
    return kv_bytes_per_token(replace(model, kv_heads=stored_kv_heads(model, num_gpus)))


def bytes_per_request(bytes_per_token: int, max_input: int, max_output: int) -> int:
    """Worst-case KV bytes of one request: ``(max_input + max_output) × bytes_per_token``."""
    return (max_input + max_output) * bytes_per_token


def bytes_for_concurrency(request_bytes: int, concurrency: int) -> int:
    """KV bytes of ``concurrency`` requests of ``request_bytes`` each."""
    return request_bytes * concurrency


@dataclass(frozen=True)
class KVBudget:
    """The KV pool of one engine instance: ``bytes`` and the ``tokens`` they hold.

    ``source`` is ``"gpu_memory"`` (computed from memory, utilization, weights)
    or ``"engine"`` (the pool size the engine reports); ``detail`` says how.
    """

    bytes: int
    tokens: int
    source: str
    detail: str


def budget_from_memory(
    gpu_memory: int,
    weights: int,
    token_bytes: int,
    *,
    utilization: float = 0.9,
    reserve: int = 0,
    num_gpus: int = 1,
) -> KVBudget:
    """``gpu_memory × num_gpus × utilization − weights − reserve`` bytes (floored).

    ``gpu_memory`` is per GPU, ``weights`` and ``reserve`` (activations,
    runtime workspace) are totals over the instance, ``token_bytes`` is
    :func:`pool_bytes_per_token`. Raises :class:`CapacityError` when the
    weights do not fit or leave no KV budget.
    """
    for field, value in (
        ("--gpu-memory", gpu_memory),
        ("--weights", weights),
        ("--num-gpus", num_gpus),
    ):
        if value <= 0:
            raise CapacityError(f"{field}: must be greater than 0, got {value}")
    if reserve < 0:
        raise CapacityError(f"reserve: must not be negative, got {reserve}")
    total = gpu_memory * num_gpus
    gpus = f"{num_gpus} GPU{'s' if num_gpus > 1 else ''}"
    if weights > total:
        raise CapacityError(
            f"--weights: {format_bytes(weights)} exceed --gpu-memory {format_bytes(gpu_memory)} × {gpus}"
        )
    usable = math.floor(total * Fraction(str(utilization)))
    kv = usable - weights - reserve
    if kv <= 0:
        raise CapacityError(
            f"--weights: {format_bytes(weights)} weights + {format_bytes(reserve)} reserve leave no KV "
            f"budget in {format_bytes(usable)} usable ({format_bytes(total)} × {utilization})"
        )
    detail = (
        f"{format_bytes(gpu_memory)} × {gpus} × {utilization} − {format_bytes(weights)} weights"
    )
    if reserve:
        detail += f" − {format_bytes(reserve)} reserve"
    return KVBudget(bytes=kv, tokens=kv // token_bytes, source="gpu_memory", detail=detail)


def budget_from_engine(
    pool_tokens: int, token_bytes: int, detail: str = "engine-reported pool"
) -> KVBudget:
    """A pool of ``pool_tokens`` tokens as reported by the engine (bytes = tokens × ``token_bytes``)."""
    if pool_tokens <= 0:
        raise CapacityError(f"engine pool: must be greater than 0 tokens, got {pool_tokens}")
    return KVBudget(
        bytes=pool_tokens * token_bytes, tokens=pool_tokens, source="engine", detail=detail
    )


def budget_from_blocks(num_blocks: int, block_size: int, token_bytes: int) -> KVBudget:
    """An engine pool of ``num_blocks`` blocks of ``block_size`` tokens."""
    detail = f"{num_blocks:,} blocks × {block_size} tokens"
    return budget_from_engine(num_blocks * block_size, token_bytes, detail)


#: Rebuilds the pool for another geometry / GPU count (for "what if" advice); ``None`` if impossible.
BudgetFor = Callable[[ModelGeometry, int], KVBudget | None]


def memory_budget(
    gpu_memory: int, weights: int, *, utilization: float = 0.9, reserve: int = 0
) -> BudgetFor:
    """Pool from GPU memory (per GPU), weights and reserve (totals), for any geometry and GPU count."""

    def budget_for(model: ModelGeometry, num_gpus: int) -> KVBudget:
        return budget_from_memory(
            gpu_memory,
            weights,
            pool_bytes_per_token(model, num_gpus),
            utilization=utilization,
            reserve=reserve,
            num_gpus=num_gpus,
        )

    return budget_for


def engine_budget(pool_tokens: int, model: ModelGeometry, num_gpus: int, detail: str) -> BudgetFor:
    """Pool the engine reports in tokens of ``model``; other dtypes re-size the same bytes.

    The pool for another GPU count is unknown (``None``).
    """
    pool = budget_from_engine(pool_tokens, pool_bytes_per_token(model, num_gpus), detail)

    def budget_for(other: ModelGeometry, n: int) -> KVBudget | None:
        if n != num_gpus:
            return None
        return replace(pool, tokens=pool.bytes // pool_bytes_per_token(other, n))

    return budget_for


def requests_fit(pool_tokens: int, tokens_per_request: int) -> int:
    """Whole requests of ``tokens_per_request`` tokens that fit in ``pool_tokens``."""
    return pool_tokens // tokens_per_request


@dataclass(frozen=True)
class RequestLimits:
    """Admission limits: ``max_input`` (> 0) and ``max_output`` (>= 0) tokens, ``concurrency`` requests."""

    max_input: int
    max_output: int
    concurrency: int = 1

    def __post_init__(self) -> None:
        for name, low in (("max_input", 1), ("max_output", 0), ("concurrency", 1)):
            if getattr(self, name) < low:
                relation = "greater than 0" if low else "negative"
                verb = "must be" if low else "must not be"
                raise CapacityError(f"--{name.replace('_', '-')}: {verb} {relation}")

    @property
    def tokens_per_request(self) -> int:
        return self.max_input + self.max_output


@dataclass(frozen=True)
class QuantileRow:
    """Load at one observed length quantile.

    ``tokens_per_request`` adds the prompt and output quantiles (conservative:
    the quantile of a sum is at most the sum of quantiles). ``requests_fit``,
    ``headroom_requests`` (fit − configured concurrency) and ``utilization``
    (configured concurrency × tokens / pool tokens) need a pool, else ``None``.
    """

    quantile: float
    prompt_tokens: int
    output_tokens: int
    tokens_per_request: int
    bytes_per_request: int
    requests_fit: int | None
    headroom_requests: int | None
    utilization: float | None

    @property
    def label(self) -> str:
        return f"p{round(self.quantile * 100):d}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "quantile": self.quantile,
            "label": self.label,
            **{
                k: getattr(self, k)
                for k in (
                    "prompt_tokens",
                    "output_tokens",
                    "tokens_per_request",
                    "bytes_per_request",
                    "requests_fit",
                    "headroom_requests",
                    "utilization",
                )
            },
        }


def quantile_rows(
    prompt: dict[float, int],
    output: dict[float, int],
    token_bytes: int,
    concurrency: int,
    budget: KVBudget | None,
) -> tuple[QuantileRow, ...]:
    """One :class:`QuantileRow` per quantile present in both ``prompt`` and ``output``."""
    rows = []
    for q in sorted(set(prompt) & set(output)):
        tokens = prompt[q] + output[q]
        fit = util = headroom = None
        if budget is not None:
            fit = requests_fit(budget.tokens, tokens) if tokens else budget.tokens
            headroom = fit - concurrency
            util = round(concurrency * tokens / budget.tokens, 4)
        rows.append(
            QuantileRow(q, prompt[q], output[q], tokens, tokens * token_bytes, fit, headroom, util)
        )
    return tuple(rows)
