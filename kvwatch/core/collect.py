"""Collection: one range query per (signal, source) for all targets at once.

Per target, each signal resolves to the first source of its dialect whose metric
names the target exports. Targets that share a source share one query, so the
number of queries depends on the dialect mix, never on the fleet size. Counters
go through ``rate()`` (restarts handled by Prometheus), histogram quantiles
through ``histogram_quantile`` over ``le``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import numpy as np

from kvwatch.core.dialects import BY, DIALECT_BY_ID, Source, SourceKind, selector
from kvwatch.core.frame import FleetData, latency_hold_steps
from kvwatch.core.models import Target, TargetKey
from kvwatch.core.promclient import QueryClient, Series
from kvwatch.core.selector import Matcher
from kvwatch.core.signals import SIGNAL_INFO, Signal
from kvwatch.durations import parse_duration
from kvwatch.errors import PrometheusBadResponse


@functools.lru_cache(maxsize=16384)
def resolve(target: Target) -> dict[Signal, Source]:
    """The source each signal uses for this target (signals without one are absent).

    Cached: the same targets are resolved by planning, collection and every cycle.
    Callers must not mutate the returned mapping.
    """
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


def plan(
    targets: list[Target],
    user_matchers: str,
    rate_window: str,
    latency_window: str | None = None,
    triton_model: str = "",
) -> dict[str, list[tuple[Signal, set[TargetKey], Source]]]:
    """PromQL → the (signal, targets, source) it serves. Identical queries are sent once.

    ``latency_window`` (default: ``rate_window``) is the window of histogram quantiles
    and means: a tail needs more requests than a 2-minute rate holds to be stable.
    ``triton_model``: regex of the Triton LLM model (empty: the models exporting ``nv_trt_llm_*``).
    """
    uses: dict[tuple[Signal, Source], set[TargetKey]] = defaultdict(set)
    for t in targets:
        for sig, src in resolve(t).items():
            uses[(sig, src)].add(t.key)
    queries: dict[str, list[tuple[Signal, set[TargetKey], Source]]] = defaultdict(list)
    for (sig, src), keys in uses.items():
        queries[src.promql(user_matchers, rate_window, latency_window, triton_model)].append((sig, keys, src))
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


def _points(vals: object) -> np.ndarray | None:
    """``values`` of one series as an (n, 2) float array [ts, value]; malformed points are dropped.

    Accepts the ndarray :func:`~kvwatch.core.promclient.decode_matrix` produces or the JSON
    list of ``[ts, "v"]`` pairs. ``"NaN"``/``"+Inf"`` stay NaN/inf (never 0).
    """
    if isinstance(vals, np.ndarray):
        return vals if vals.ndim == 2 and vals.shape[1] == 2 and vals.dtype.kind == "f" else None
    if not isinstance(vals, list) or not vals:
        return None
    try:
        arr = np.array(vals, dtype=float)  # one C pass when every point is well formed
        if arr.ndim == 2 and arr.shape[1] == 2:
            return arr
    except (TypeError, ValueError, OverflowError):
        pass
    pts: list[tuple[float, float]] = []
    for p in vals:
        try:
            t, v = p
            pts.append((float(t), float(v)))
        except (TypeError, ValueError, OverflowError):
            continue
    return np.array(pts, dtype=float).reshape(-1, 2)


def _to_grid(series: Series, grid: np.ndarray, step: float, transform: float | None = None) -> np.ndarray:
    """Place a series' samples on ``grid`` (nearest slot); slots without a sample are NaN."""
    out = np.full(len(grid), np.nan)
    arr = _points(series.get("values")) if isinstance(series, dict) else None
    if arr is None or not len(arr) or not len(grid) or not step > 0:
        return out
    if len(arr) == len(grid) and arr[0, 0] == grid[0] and arr[-1, 0] == grid[-1]:
        return arr[:, 1].copy()  # the usual case: a complete series exactly on the grid
    with np.errstate(invalid="ignore", over="ignore"):
        pos = (arr[:, 0] - grid[0]) / step
    ok = np.isfinite(pos) & (pos > -0.5) & (pos < len(grid) - 0.5)
    idx = np.rint(pos[ok]).astype(np.int64)
    out[idx] = arr[ok, 1] if transform is None else transform
    return out


_LATENCY_KINDS = (SourceKind.HIST_QUANTILE, SourceKind.HIST_MEAN)

# RE2 rejects escapes of characters that are not metacharacters (Python's re.escape makes some)
_RE2_META = re.compile(r"[\\.+*?()|\[\]{}^$]")

#: deepest halving of a too-large query: 2**MAX_SPLIT_DEPTH chunks at most
MAX_SPLIT_DEPTH = 8


def _too_large(exc: PrometheusBadResponse) -> bool:
    """Prometheus' answer when a query would exceed ``--query.max-samples`` (or a proxy's limit)."""
    text = exc.detail.lower()
    return "too many samples" in text or "exceeded maximum resolution" in text or "max-samples" in text


def instances_matcher(keys: list[TargetKey]) -> str:
    """``instance=~"a|b"`` for exactly these targets (regex metacharacters escaped for RE2)."""
    alternatives = "|".join(_RE2_META.sub(r"\\\g<0>", k.instance) for k in keys)
    return Matcher("instance", "=~", alternatives).render()


def join_matchers(*matchers: str) -> str:
    return ", ".join(m for m in matchers if m)


def _split(
    keys: list[TargetKey], fetch: Callable[[list[TargetKey]], list[Series]], depth: int = 1
) -> list[list[Series]]:
    """Fetch ``keys`` in halves, halving again while Prometheus still says the answer is too large."""
    if len(keys) <= 1 or depth > MAX_SPLIT_DEPTH:
        return [fetch(keys)]
    mid = len(keys) // 2
    out: list[list[Series]] = []
    for half in (keys[:mid], keys[mid:]):
        try:
            out.append(fetch(half))
        except PrometheusBadResponse as exc:
            if not _too_large(exc):
                raise
            out.extend(_split(half, fetch, depth + 1))
    return out


def _latency_hold(latency_window: str | None, step_s: float) -> int:
    """Grid steps between latency samples: about a tenth of the latency window, at least 1."""
    if not latency_window or step_s <= 0:
        return 1
    try:
        lw = parse_duration(latency_window)
    except ValueError:
        return 1
    return latency_hold_steps(lw, step_s)


def _hold_index(n: int, k0: int, hold: int) -> np.ndarray:
    """For each of ``n`` slots, the coarse sample slot it takes its value from (-1: none yet)."""
    idx = np.arange(n)
    return np.where(idx >= k0, k0 + (idx - k0) // hold * hold, -1)


def _hold_forward(vals: np.ndarray, src: np.ndarray) -> np.ndarray:
    """Spread coarse samples over the slots after them (``src`` from :func:`_hold_index`)."""
    out = vals[np.maximum(src, 0)]
    out[src < 0] = np.nan  # before the first coarse sample nothing is known
    return out


def _instant_to_grid(series: Series, n: int) -> np.ndarray:
    """A static signal read at the evaluation instant, held over the whole grid."""
    out = np.full(n, np.nan)
    point = series.get("value") if isinstance(series, dict) else None
    with contextlib.suppress(TypeError, ValueError, IndexError, KeyError, OverflowError):
        out[:] = float(point[1])  # type: ignore[index]
    return out


def query_modes(
    queries: dict[str, list[tuple[Signal, set[TargetKey], Source]]],
    range_signals: frozenset[Signal] | None,
    latency_window: str | None,
    step_s: float,
) -> dict[str, str]:
    """How each planned query is fetched: ``static``, ``coarse`` or ``range``.

    ``static``: signals that only need their value now (pool size, max concurrency, or
    no rule condition reads them) — one instant query, held over the grid.
    ``coarse``: histogram quantiles over a long latency window change slowly; sampled
    every ~1/10 of that window (a multiple of the step) and held between samples.
    """
    def instant_only(sig: Signal) -> bool:
        return SIGNAL_INFO[sig].static or (range_signals is not None and sig not in range_signals)

    hold = _latency_hold(latency_window, step_s)
    out: dict[str, str] = {}
    for q, uses in queries.items():
        if all(instant_only(sig) for sig, _, _ in uses):
            out[q] = "static"
        elif hold > 1 and all(src.kind in _LATENCY_KINDS for _, _, src in uses):
            out[q] = "coarse"
        else:
            out[q] = "range"
    return out


def first_coarse_slot(grid: np.ndarray, step_s: float, hold: int) -> int:
    """Index of the first grid slot that is a coarse (latency) sample slot.

    Coarse slots are the instants whose step number (``t / step``) is a multiple of
    ``hold``: fixed in absolute time, so a window fetched at any aligned instant —
    whole or in increments — samples the latency quantiles at the same instants
    (the newest one is up to ``(hold - 1) * step`` old).
    """
    if hold <= 1 or not len(grid):
        return 0
    first = int(np.rint(grid[0] / step_s))
    return (-first) % hold


def bucket_query(src: Source, user_matchers: str) -> str:
    """The ``le`` bounds of a histogram family per target (an instant query; buckets are config)."""
    sel = selector(f"{src.metric}_bucket", src.matchers, user_matchers)
    return f"group by ({BY}, le) ({sel})"


def finite_les(rows: list[Series]) -> dict[TargetKey, tuple[float, ...]]:
    """Per target, the finite ``le`` bounds of the histogram rows, ascending (``+Inf`` and junk ignored)."""
    acc: dict[TargetKey, set[float]] = defaultdict(set)
    for row in rows:
        m = row.get("metric") if isinstance(row, dict) else None
        if not isinstance(m, dict):
            continue
        try:
            le = float(m.get("le", "nan"))
        except (TypeError, ValueError):
            continue
        if not math.isfinite(le):
            continue
        acc[TargetKey(str(m.get("job", "")), str(m.get("instance", "")))].add(le)
    return {k: tuple(sorted(v)) for k, v in acc.items()}


def bucket_layouts(
    client: QueryClient, targets: list[Target], user_matchers: str, at: datetime
) -> dict[TargetKey, dict[Signal, tuple[float, ...]]]:
    """Per target and quantile signal, the finite histogram bucket bounds (signal units, ascending).

    The highest is the bound ``histogram_quantile`` clamps to; the others say which bucket an
    interpolated quantile lies in (the only thing the histogram knows about it).
    One instant query per histogram family in use. A family Prometheus refuses leaves its
    targets without a layout: quantiles stay as they are (never a reason to fail a cycle).
    The answer depends on each target's own bucket series only, so measuring a superset
    of targets gives every target the same layout.
    """
    uses: dict[tuple[Signal, Source], set[TargetKey]] = defaultdict(set)
    for t in targets:
        for sig, src in resolve(t).items():
            if src.kind is SourceKind.HIST_QUANTILE:
                uses[(sig, src)].add(t.key)
    fams: dict[str, list[tuple[Signal, set[TargetKey], Source]]] = defaultdict(list)
    for (sig, src), keys in uses.items():
        fams[bucket_query(src, user_matchers)].append((sig, keys, src))
    out: dict[TargetKey, dict[Signal, tuple[float, ...]]] = {}
    for q, fam in sorted(fams.items()):
        try:
            les = finite_les(client.instant(q, at))
        except PrometheusBadResponse:
            continue
        for sig, keys, src in fam:
            for key in keys & les.keys():
                out.setdefault(key, {})[sig] = tuple(le * src.scale for le in les[key])
    return out


def ceilings_of(layouts: Mapping[TargetKey, Mapping[Signal, tuple[float, ...]]]) -> dict[TargetKey, dict[Signal, float]]:
    """The highest finite bound of each layout (what ``histogram_quantile`` clamps to)."""
    return {k: {s: les[-1] for s, les in sigs.items() if les} for k, sigs in layouts.items()}


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
    latency_window: str | None = None,
    range_signals: frozenset[Signal] | None = None,
    triton_model: str = "",
    hold_static: bool = True,
    ceilings: Mapping[TargetKey, Mapping[Signal, float]] | None = None,
    layouts: Mapping[TargetKey, Mapping[Signal, tuple[float, ...]]] | None = None,
) -> FleetData:
    """Fetch every signal of every target over [at − window, at] on a ``step_s`` grid.

    ``range_signals`` (default: all) are fetched as series over the window; the others
    only at ``at`` and held over the grid — for signals no rule condition reads (they
    only fill triage text), which spares Prometheus most histogram work.
    ``hold_static`` False fetches static signals (pool size, max concurrency) over the
    window too: a backtest replays every instant of a long span, and a value read at its
    end would leak into earlier steps (a cap cut and restored inside the span).
    ``ceilings`` (default: measured now with :func:`bucket_layouts`) are the histogram
    bounds when the caller already knows them (the service refreshes them with discovery);
    ``layouts`` the whole bucket bounds with them (None with given ceilings: not known).
    """
    end = at.timestamp()
    n = int(window_s // step_s)
    grid = end - step_s * np.arange(n, -1, -1, dtype=float)
    start = datetime.fromtimestamp(grid[0], tz=UTC)
    data = FleetData(grid=grid, targets={t.key: t for t in targets})
    for t in targets:
        data.sourced[t.key] = set(resolve(t))
    queries = plan(targets, user_matchers, rate_window, latency_window, triton_model)

    modes = query_modes(queries, range_signals, latency_window, step_s)
    if not hold_static:
        modes = {q: "range" if m == "static" else m for q, m in modes.items()}
    static = {q for q, m in modes.items() if m == "static"}
    coarse = {q for q, m in modes.items() if m == "coarse"}
    hold = _latency_hold(latency_window, step_s)
    k0 = first_coarse_slot(grid, step_s, hold)
    hold_src = _hold_index(len(grid), k0, hold)
    coarse_start = datetime.fromtimestamp(grid[min(k0, n)], tz=UTC)

    def fetch(q: str, mode: str) -> list[Series]:
        if mode == "static":
            return client.instant(q, at)
        if mode == "coarse":
            return client.range(q, coarse_start, at, step_s * hold)
        return client.range(q, start, at, step_s)

    def run(q: str) -> tuple[str, list[Series]]:
        mode = "static" if q in static else "coarse" if q in coarse else "range"
        try:
            return q, fetch(q, mode)
        except PrometheusBadResponse as exc:
            if not _too_large(exc):
                raise
        # Prometheus refused to load that many samples (--query.max-samples): ask again
        # for halves of the targets this query serves, down to single targets.
        keys = sorted(set().union(*(k for _, k, _ in queries[q])), key=lambda k: (k.job, k.instance))
        src = queries[q][0][2]

        def fetch_chunk(sub: list[TargetKey]) -> list[Series]:
            matchers = join_matchers(user_matchers, instances_matcher(sub))
            return fetch(src.promql(matchers, rate_window, latency_window, triton_model), mode)

        return q, [row for chunk in _split(keys, fetch_chunk) for row in chunk]

    with ThreadPoolExecutor(max_workers=max_concurrency) as pool:
        answers = list(pool.map(run, sorted(queries)))
    if ceilings is None:
        layouts = bucket_layouts(client, targets, user_matchers, at)
        ceilings = ceilings_of(layouts)
    data.ceilings = {t.key: dict(ceilings[t.key]) for t in targets if t.key in ceilings}
    layouts = layouts or {}
    data.buckets = {t.key: dict(layouts[t.key]) for t in targets if t.key in layouts}
    # vllm:cache_config_info: one pool per data-parallel engine; a config change within
    # the window gives an engine several rows (keep its largest), engines are summed.
    pools: dict[tuple[TargetKey, Signal], dict[str, np.ndarray]] = defaultdict(dict)
    for q, rows in answers:
        uses = queries[q]
        for row in rows:
            m = row.get("metric") if isinstance(row, dict) else None
            if not isinstance(m, dict):
                continue
            key = TargetKey(str(m.get("job", "")), str(m.get("instance", "")))
            if not any(key in keys for _, keys, _ in uses):
                continue
            if q in static:
                vals = _instant_to_grid(row, len(grid))
            else:
                vals = _to_grid(row, grid, step_s)
                if q in coarse:
                    vals = _hold_forward(vals, hold_src)
            for sig, keys, src in uses:
                if key not in keys:
                    continue
                if src.kind is SourceKind.VLLM_CACHE_INFO:
                    tokens = cache_info_tokens(m)
                    if tokens is None:
                        continue
                    info = np.where(np.isnan(vals), np.nan, tokens)
                    engines = pools[(key, sig)]
                    engine = str(m.get("engine", ""))
                    prev = engines.get(engine)
                    engines[engine] = info if prev is None else np.fmax(prev, info)
                else:
                    data.put(key, sig, vals)
    for (key, sig), engines in pools.items():
        stack = np.vstack(list(engines.values()))
        total = np.where(np.isnan(stack), 0.0, stack).sum(axis=0)
        data.put(key, sig, np.where(np.isnan(stack).all(axis=0), np.nan, total))
    return data
