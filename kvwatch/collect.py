"""Collection: one range query per (signal, source) for all targets at once.

Per target, each signal resolves to the first source of its dialect whose metric
names the target exports. Targets that share a source share one query, so the
number of queries depends on the dialect mix, never on the fleet size. Counters
go through ``rate()`` (restarts handled by Prometheus), histogram quantiles
through ``histogram_quantile`` over ``le``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import numpy as np

from kvwatch.dialects import DIALECT_BY_ID, Source, SourceKind
from kvwatch.fleetdata import FleetData
from kvwatch.models import Target, TargetKey
from kvwatch.promclient import QueryClient, Series
from kvwatch.signals import Signal


def resolve(target: Target) -> dict[Signal, Source]:
    """The source each signal uses for this target (signals without one are absent)."""
    d = DIALECT_BY_ID.get(target.dialect)
    if d is None:
        return {}
    out: dict[Signal, Source] = {}
    for sig, sources in d.sources.items():
        for src in sources:
            if all(n in target.names for n in src.requires):
                out[sig] = src
                break
    return out


def plan(targets: list[Target], user_matchers: str, rate_window: str) -> dict[str, list[tuple[Signal, set[TargetKey], Source]]]:
    """PromQL → the (signal, targets, source) it serves. Identical queries are sent once."""
    uses: dict[tuple[Signal, Source], set[TargetKey]] = defaultdict(set)
    for t in targets:
        for sig, src in resolve(t).items():
            uses[(sig, src)].add(t.key)
    queries: dict[str, list[tuple[Signal, set[TargetKey], Source]]] = defaultdict(list)
    for (sig, src), keys in uses.items():
        queries[src.promql(user_matchers, rate_window)].append((sig, keys, src))
    return dict(queries)


def cache_info_tokens(labels: dict[str, str]) -> float | None:
    """KV capacity from vllm:cache_config_info labels: kv_cache_size_tokens, else blocks × block size."""
    def num(name: str) -> float | None:
        try:
            v = float(labels.get(name, ""))
        except ValueError:
            return None  # "None" on vLLM V1 <= 0.8.x, missing on older versions
        return v if math.isfinite(v) and v > 0 else None

    tokens = num("kv_cache_size_tokens")
    if tokens is not None:
        return tokens
    blocks, size = num("num_gpu_blocks"), num("block_size")
    return None if blocks is None or size is None else blocks * size


def _to_grid(series: Series, grid: np.ndarray, step: float, transform: float | None = None) -> np.ndarray:
    out = np.full(len(grid), np.nan)
    vals = series.get("values") or []
    if not vals or not len(grid):
        return out
    arr = np.array([(float(t), float(v)) for t, v in vals], dtype=float)
    idx = np.rint((arr[:, 0] - grid[0]) / step).astype(int)
    ok = (idx >= 0) & (idx < len(grid))
    out[idx[ok]] = arr[ok, 1] if transform is None else transform
    return out


def collect(
    client: QueryClient,
    targets: list[Target],
    *,
    at: datetime,
    window_s: float,
    step_s: float,
    rate_window: str,
    user_matchers: str,
    max_concurrency: int = 4,
) -> FleetData:
    """Fetch every signal of every target over [at − window, at] on a ``step_s`` grid."""
    end = at.timestamp()
    n = int(window_s // step_s)
    grid = end - step_s * np.arange(n, -1, -1, dtype=float)
    start = datetime.fromtimestamp(grid[0], tz=UTC)
    data = FleetData(grid=grid, targets={t.key: t for t in targets})
    for t in targets:
        data.sourced[t.key] = set(resolve(t))
    queries = plan(targets, user_matchers, rate_window)

    def run(q: str) -> tuple[str, list[Series]]:
        return q, client.range(q, start, at, step_s)

    with ThreadPoolExecutor(max_workers=max_concurrency) as pool:
        answers = list(pool.map(run, sorted(queries)))
    for q, rows in answers:
        for sig, keys, src in queries[q]:
            for row in rows:
                m = row.get("metric", {})
                key = TargetKey(m.get("job", ""), m.get("instance", ""))
                if key not in keys:
                    continue
                if src.kind is SourceKind.VLLM_CACHE_INFO:
                    tokens = cache_info_tokens(m)
                    if tokens is None:
                        continue
                    vals = _to_grid(row, grid, step_s, transform=tokens)
                    prev = data.values(key, sig)
                    data.put(key, sig, vals if prev is None else np.fmax(prev, vals))
                else:
                    data.put(key, sig, _to_grid(row, grid, step_s))
    return data
