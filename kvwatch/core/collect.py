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
import gc
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Set
from concurrent.futures import Executor, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import ParamSpec, TypeVar

import numpy as np

from kvwatch.core.dialects import BY, Source, SourceKind, resolve, selector
from kvwatch.core.frame import FleetData, latency_hold_steps
from kvwatch.core.models import Target, TargetKey, target_key
from kvwatch.core.promclient import QueryClient, Series
from kvwatch.core.quantile import bucket_quantile, parse_le, quantile_rows
from kvwatch.core.selector import Matcher
from kvwatch.core.signals import SIGNAL_INFO, Signal
from kvwatch.durations import parse_duration
from kvwatch.errors import PrometheusBadResponse


def plan(
    targets: list[Target],
    user_matchers: str,
    rate_window: str,
    latency_window: str | None = None,
    triton_model: str = "",
    signals: Set[Signal] | None = None,
    fresh: bool = False,
) -> dict[str, list[tuple[Signal, set[TargetKey], Source]]]:
    """PromQL → the (signal, targets, source) it serves. Identical queries are sent once.

    ``latency_window`` (default: ``rate_window``) is the window of histogram quantiles
    and means: a tail needs more requests than a 2-minute rate holds to be stable.
    ``triton_model``: regex of the Triton LLM model (empty: the models exporting ``nv_trt_llm_*``).
    ``signals`` (default: all): plan only these. ``fresh``: gauges through
    :func:`~kvwatch.core.dialects.model.newest_scrape` (targets with relabel leftovers).
    """
    # A target's sources depend only on its dialect and metric names (resolve): targets are
    # grouped by those first (a str and a frozenset, whose hashes CPython caches), and each
    # group's key set is merged into every (signal, source) it uses as a set, which reuses the
    # stored hashes. Per target and signal this was a Source hash (a Python-level dataclass
    # hash of 17 fields) and a TargetKey hash: ~17,000 of each per 1,000 targets, ~25 ms.
    # Groups come in the order of their first target, so ``uses`` gets its keys in the same
    # order as target by target.
    groups: dict[tuple[str, frozenset[str]], tuple[Target, list[TargetKey]]] = {}
    for t in targets:
        g = groups.get((t.dialect, t.names))
        if g is None:
            groups[(t.dialect, t.names)] = (t, [t.key])
        else:
            g[1].append(t.key)
    uses: dict[tuple[Signal, Source], set[TargetKey]] = defaultdict(set)
    for first, keys in groups.values():
        keyset = set(keys)
        for sig, src in resolve(first).items():
            if signals is None or sig in signals:
                uses[(sig, src)] |= keyset
    queries: dict[str, list[tuple[Signal, set[TargetKey], Source]]] = defaultdict(list)
    for (sig, src), keys in uses.items():
        queries[src.promql(user_matchers, rate_window, latency_window, triton_model, fresh=fresh)].append(
            (sig, keys, src))
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


def _to_grid(series: Series, grid: np.ndarray, step: float) -> np.ndarray:
    """Place a series' samples on ``grid`` (nearest slot); slots without a sample are NaN."""
    return _grid_rows([series], grid, step)[0][0]


def _grid_rows(rows: list[Series], grid: np.ndarray, step: float) -> tuple[np.ndarray, np.ndarray]:
    """Every series' samples on ``grid`` at once: a (len(rows), len(grid)) matrix (nearest slot;
    NaN without a sample) and which slots hold a sample (a sample may be NaN itself).

    One numpy pass over all samples of an answer instead of one per series: placing them
    was most of kvwatch's collection CPU at fleet scale.
    """
    n = len(grid)
    out = np.full((len(rows), n), np.nan)
    present = np.zeros((len(rows), n), dtype=bool)
    if not rows or not n or not step > 0:
        return out, present
    arrs = [_points(r.get("values")) if isinstance(r, dict) else None for r in rows]
    lens = [0 if a is None else len(a) for a in arrs]
    if not sum(lens):
        return out, present
    pts = np.concatenate([a for a in arrs if a is not None and len(a)])
    which = np.repeat(np.arange(len(rows)), lens)
    with np.errstate(invalid="ignore", over="ignore"):
        pos = (pts[:, 0] - grid[0]) / step
    ok = np.isfinite(pos) & (pos > -0.5) & (pos < n - 0.5)
    idx = np.rint(pos[ok]).astype(np.int64)
    out[which[ok], idx] = pts[ok, 1]
    present[which[ok], idx] = True
    return out, present


_LATENCY_KINDS = (SourceKind.HIST_QUANTILE, SourceKind.HIST_MEAN)

# RE2 rejects escapes of characters that are not metacharacters (Python's re.escape makes some)
_RE2_META = re.compile(r"[\\.+*?()|\[\]{}^$]")

#: deepest halving of a too-large query: 2**MAX_SPLIT_DEPTH chunks at most
MAX_SPLIT_DEPTH = 8


def too_large(exc: PrometheusBadResponse) -> bool:
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
            if not too_large(exc):
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
    """Spread coarse samples over the slots after them (``src`` from :func:`_hold_index`;
    ``vals``: one row or a matrix of rows)."""
    out = vals[..., np.maximum(src, 0)]
    out[..., src < 0] = np.nan  # before the first coarse sample nothing is known
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


Uses = list[tuple[Signal, set[TargetKey], Source]]


def quantile_families(
    queries: Mapping[str, Uses], modes: Mapping[str, str], user_matchers: str, rate_window: str,
    latency_window: str | None = None, triton_model: str = "",
) -> dict[str, list[str]]:
    """Bucket-rate query → the ``histogram_quantile`` queries (two or more) it can answer.

    Quantiles of one histogram family fetched the same way (same mode) read the same bucket
    series: one ``sum by (job, instance, le)`` of their rates gives all of them
    (:func:`family_quantiles`), and Prometheus selects and decodes the buckets once.
    """
    fams: dict[tuple[str, str], list[str]] = defaultdict(list)
    for q, uses in queries.items():
        srcs = {src for _, _, src in uses}
        if len(srcs) != 1:
            continue
        b = next(iter(srcs)).bucket_promql(user_matchers, rate_window, latency_window, triton_model)
        if b is not None:
            fams[(b, modes[q])].append(q)
    out: dict[str, list[str]] = {}
    for (b, _), qs in sorted(fams.items()):
        if len(qs) >= 2 and b not in out:
            out[b] = sorted(qs)
    return out


def family_quantiles(
    rows: list[Series], grid: np.ndarray, step_s: float, instant: bool, qs: list[float]
) -> tuple[dict[TargetKey, np.ndarray], set[TargetKey]]:
    """Per target, ``histogram_quantile(q, ·)`` of every ``q`` in ``qs`` from bucket-rate rows
    (one per job, instance, le) on ``grid``: a (len(qs), len(grid)) array, NaN where Prometheus
    answers NaN or nothing. ``instant``: rows of an instant query (one value, held over the grid).

    Also returns the targets whose buckets kvwatch cannot interpolate exactly as Prometheus
    does (see :mod:`kvwatch.core.quantile`): the caller asks Prometheus for them.
    """
    n = len(grid)
    # grouped by the rows' (job, instance) label pairs; a TargetKey is built once per target
    per_key: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    unsure_pairs: set[tuple[str, str]] = set()
    kept: list[Series] = []
    les: dict[str, float | None] = {}
    for row in rows:
        m = row.get("metric") if isinstance(row, dict) else None
        if not isinstance(m, dict):
            continue
        key = (str(m.get("job", "")), str(m.get("instance", "")))
        le = m.get("le", "")
        if le not in les:
            les[le] = parse_le(le) if isinstance(le, str) else None
        bound = les[le]
        if bound is None:
            unsure_pairs.add(key)
        elif not math.isnan(bound):  # Prometheus skips a bucket without a readable bound
            per_key[key].append((bound, len(kept)))
            kept.append(row)
    if instant:
        vals = np.array([_instant_to_grid(r, 1)[0] for r in kept]).reshape(-1, 1) * np.ones(n)
        present = np.ones(vals.shape, dtype=bool)
    else:
        vals, present = _grid_rows(kept, grid, step_s)
    out: dict[TargetKey, np.ndarray] = {}
    unsure = {TargetKey(*pair) for pair in unsure_pairs}
    groups: dict[tuple[float, ...], list[tuple[TargetKey, list[int]]]] = defaultdict(list)
    for pair, items in per_key.items():
        if pair in unsure_pairs:
            continue
        key = TargetKey(*pair)
        items.sort(key=lambda it: it[0])
        bounds = tuple(b for b, _ in items)
        if len(set(bounds)) == len(bounds):
            groups[bounds].append((key, [r for _, r in items]))
            continue
        if max(Counter(bounds).values()) > 2:
            unsure.add(key)  # the sum of three counts depends on Prometheus' series order
            continue
        # two spellings of one bound ("1", "1.0"): added per step, as Prometheus coalesces them
        arr = np.full((len(qs), n), np.nan)
        for t in range(n):
            pairs = [(b, float(vals[r, t])) for b, r in items if present[r, t]]
            if pairs:
                arr[:, t] = [bucket_quantile(q, pairs) for q in qs]
        out[key] = arr
    for bounds, members in groups.items():
        idx = np.array([r for _, r in members])  # (K, B) row numbers
        # (K, B, n) -> (K * n, B): one histogram per target and step
        counts = vals[idx].transpose(0, 2, 1).reshape(-1, len(bounds))
        held = present[idx].transpose(0, 2, 1).reshape(-1, len(bounds))
        res = quantile_rows(qs, np.array(bounds), counts, held).reshape(len(qs), len(members), n)
        for i, (key, _) in enumerate(members):
            out[key] = res[:, i, :]
    return out, unsure


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
        acc[target_key(m)].add(le)
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


_P = ParamSpec("_P")
_R = TypeVar("_R")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block (reference counting still frees
    every object as soon as it is unused; only reference cycles wait until after the block).

    Collection allocates a container per decoded series (~20,000 per steady cycle at 1,000
    targets, ~100,000 at 5,000) that all stay alive until placed. Each allocation burst made
    the collector re-traverse them — and, about once per cycle, every long-lived object of the
    process (~140,000) — while creating no reference cycle to find: ~0.1 s of CPU per steady
    cycle at 1,000 targets, measured. The switch is process-wide: the block re-enables only
    what it disabled itself (a caller that turned collection off keeps it off; two threads
    collecting at once end with it on).
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _gc_paused_call(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` run inside :func:`gc_paused`."""
    @functools.wraps(fn)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with gc_paused():
            return fn(*args, **kwargs)

    return run


@_gc_paused_call
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
    merge_quantiles: bool = True,
    signals: Set[Signal] | None = None,
    fresh: bool = False,
    pool: Executor | None = None,
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
    ``merge_quantiles`` fetches the quantiles of one histogram family as one bucket query
    (:func:`quantile_families`); False sends each ``histogram_quantile`` to Prometheus.
    ``signals`` (default: all) fetches only these; ``sourced``, ceilings and layouts still
    cover every signal (a two-pass cycle fetches the triage-only ones later, for a few targets).
    ``fresh``: gauges without relabel leftovers (:mod:`kvwatch.core.churn` re-reads those targets).
    ``pool`` (default: one of ``max_concurrency`` workers for this call): the executor the
    queries run on, when the caller shares one between this and other queries.
    """
    end = at.timestamp()
    n = int(window_s // step_s)
    grid = end - step_s * np.arange(n, -1, -1, dtype=float)
    start = datetime.fromtimestamp(grid[0], tz=UTC)
    data = FleetData(grid=grid, targets={t.key: t for t in targets})
    for t in targets:
        data.sourced[t.key] = set(resolve(t))
    queries = plan(targets, user_matchers, rate_window, latency_window, triton_model, signals, fresh)

    modes = query_modes(queries, range_signals, latency_window, step_s)
    if not hold_static:
        modes = {q: "range" if m == "static" else m for q, m in modes.items()}
    families = (quantile_families(queries, modes, user_matchers, rate_window, latency_window, triton_model)
                if merge_quantiles else {})
    replaced = {q for qs in families.values() for q in qs}
    # what is sent: every planned query, with the quantiles of one family as one bucket query
    mode_of = {**{q: m for q, m in modes.items() if q not in replaced},
               **{b: modes[qs[0]] for b, qs in families.items()}}
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

    def render(q: str, matchers: str) -> str:
        """``q`` (planned or a family's bucket query) for other matchers."""
        if q in families:
            src = queries[families[q][0]][0][2]
            return src.bucket_promql(matchers, rate_window, latency_window, triton_model) or ""
        return queries[q][0][2].promql(matchers, rate_window, latency_window, triton_model)

    def served(q: str) -> list[TargetKey]:
        uses = [u for p in families.get(q, [q]) for u in queries[p]]
        return sorted(set().union(*(k for _, k, _ in uses)), key=lambda k: (k.job, k.instance))

    def run(q: str) -> tuple[str, list[Series]]:
        mode = mode_of[q]
        try:
            return q, fetch(q, mode)
        except PrometheusBadResponse as exc:
            if not too_large(exc):
                raise
        # Prometheus refused to load that many samples (--query.max-samples): ask again
        # for halves of the targets this query serves, down to single targets.
        def fetch_chunk(sub: list[TargetKey]) -> list[Series]:
            return fetch(render(q, join_matchers(user_matchers, instances_matcher(sub))), mode)

        return q, [row for chunk in _split(served(q), fetch_chunk) for row in chunk]

    # vllm:cache_config_info: one pool per data-parallel engine; a config change within
    # the window gives an engine several rows (keep its largest), engines are summed.
    pools: dict[tuple[TargetKey, Signal], dict[str, np.ndarray]] = defaultdict(dict)
    key_of = {(t.key.job, t.key.instance): t.key for t in targets}

    def place(q: str, rows: list[Series]) -> None:
        uses = queries[q]
        mode = modes[q]
        # rows matched by their (job, instance) label pairs, mapped to each target's key once
        wanted = {(k.job, k.instance) for _, keys, _ in uses for k in keys}
        mine: list[tuple[Series, dict[str, str], TargetKey]] = []
        for row in rows:
            m = row.get("metric") if isinstance(row, dict) else None
            if not isinstance(m, dict):
                continue
            pair = (str(m.get("job", "")), str(m.get("instance", "")))
            if pair in wanted:
                mine.append((row, m, key_of[pair]))
        if mode == "static":
            grids = np.array([_instant_to_grid(r, 1)[0] for r, _, _ in mine]).reshape(-1, 1) * np.ones(len(grid))
        else:
            grids = _grid_rows([r for r, _, _ in mine], grid, step_s)[0]
            if mode == "coarse":
                grids = _hold_forward(grids, hold_src)
        if len(uses) == 1 and uses[0][2].kind is not SourceKind.VLLM_CACHE_INFO:
            sig = uses[0][0]  # the usual case: one signal, every row is its row
            for (_, _, key), vals in zip(mine, grids, strict=True):
                data.put(key, sig, vals)
            return
        for (_, m, key), vals in zip(mine, grids, strict=True):
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

    def place_family(b: str, rows: list[Series]) -> None:
        fam = families[b]
        srcs = [queries[q][0][2] for q in fam]
        mode = mode_of[b]
        values, unsure = family_quantiles(rows, grid, step_s, mode == "static", [s.quantile for s in srcs])
        for j, (q, src) in enumerate(zip(fam, srcs, strict=True)):
            for sig, keys, _ in queries[q]:
                for key in keys & values.keys():
                    # Prometheus scales the quantile after histogram_quantile (``(…) * scale``)
                    vals = values[key][j] * src.scale if src.scale != 1.0 else values[key][j].copy()
                    data.put(key, sig, _hold_forward(vals, hold_src) if mode == "coarse" else vals)
        if unsure:  # buckets kvwatch cannot interpolate exactly: Prometheus' own answer for those
            matchers = join_matchers(user_matchers, instances_matcher(sorted(unsure, key=lambda k: (k.job, k.instance))))
            for q in fam:
                place(q, fetch(queries[q][0][2].promql(matchers, rate_window, latency_window, triton_model), mode))

    def fetch_and_place(ex: Executor) -> None:
        # each answer is placed as soon as it and those before it are in, while Prometheus
        # still evaluates the later queries (in the planned order: placement stays reproducible)
        for answer in [ex.submit(run, q) for q in sorted(mode_of)]:
            q, rows = answer.result()
            if q in families:
                place_family(q, rows)
            else:
                place(q, rows)

    if pool is None:
        with ThreadPoolExecutor(max_workers=max_concurrency) as own:
            fetch_and_place(own)
    else:
        fetch_and_place(pool)
    if ceilings is None:
        layouts = bucket_layouts(client, targets, user_matchers, at)
        ceilings = ceilings_of(layouts)
    data.ceilings = {t.key: dict(ceilings[t.key]) for t in targets if t.key in ceilings}
    layouts = layouts or {}
    data.buckets = {t.key: dict(layouts[t.key]) for t in targets if t.key in layouts}
    for (key, sig), engines in pools.items():
        stack = np.vstack(list(engines.values()))
        total = np.where(np.isnan(stack), 0.0, stack).sum(axis=0)
        data.put(key, sig, np.where(np.isnan(stack).all(axis=0), np.nan, total))
    return data
