"""KV-cache capacity math: bytes per token, per request, per concurrency, and what fits.

Public API (all sizes in bytes, all counts in tokens or requests, ``int``)::

    from kvwatch.tools.capacity import KVDtype, ModelGeometry, RequestLimits, kv_bytes_per_token
    m = ModelGeometry(layers=32, kv_heads=8, head_dim=128, kv_dtype=KVDtype.BF16)
    kv_bytes_per_token(m)  # 131072 = 128 KiB
"""

from __future__ import annotations

from kvwatch.tools.capacity.hfconfig import build_geometry, geometry_from_config, load_config
from kvwatch.tools.capacity.math import (
    QUANTILES,
    BudgetFor,
    KVBudget,
    QuantileRow,
    RequestLimits,
    budget_from_blocks,
    budget_from_engine,
    budget_from_memory,
    bytes_for_concurrency,
    bytes_per_request,
    engine_budget,
    kv_bytes_per_token,
    memory_budget,
    pool_bytes_per_token,
    quantile_rows,
    requests_fit,
    stored_kv_heads,
)
from kvwatch.tools.capacity.model import KVDtype, ModelGeometry
from kvwatch.tools.capacity.plan import Advice, CapacityPlan, Recommendation, plan_capacity
from kvwatch.tools.capacity.units import (
    CapacityError,
    format_bytes,
    format_exact,
    parse_fraction,
    parse_positive_int,
    parse_size,
    parse_tokens,
)

__all__ = [
    "QUANTILES",
    "Advice",
    "BudgetFor",
    "CapacityError",
    "CapacityPlan",
    "KVBudget",
    "KVDtype",
    "ModelGeometry",
    "QuantileRow",
    "Recommendation",
    "RequestLimits",
    "budget_from_blocks",
    "budget_from_engine",
    "budget_from_memory",
    "build_geometry",
    "bytes_for_concurrency",
    "bytes_per_request",
    "engine_budget",
    "format_bytes",
    "format_exact",
    "geometry_from_config",
    "kv_bytes_per_token",
    "load_config",
    "memory_budget",
    "parse_fraction",
    "parse_positive_int",
    "parse_size",
    "parse_tokens",
    "plan_capacity",
    "pool_bytes_per_token",
    "quantile_rows",
    "requests_fit",
    "stored_kv_heads",
]
