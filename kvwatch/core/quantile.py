"""Prometheus' ``histogram_quantile`` over classic buckets, computed by kvwatch.

Two quantiles of one histogram family (TTFT p50 and p99) read the same bucket
series. Asking Prometheus for ``sum by (job, instance, le) (rate(x_bucket[w]))``
once and interpolating here halves what it selects and decodes for them
(``core/collect.py``). The result must equal what
``histogram_quantile(q, sum by (job, instance, le) (…))`` returns, to the bit:
this is the algorithm of Prometheus 2.x (``promql/quantile.go``, ``bucketQuantile``)
with its edge cases — no ``+Inf`` bucket (NaN), fewer than two buckets (NaN), zero
observations (NaN), the rank in the ``+Inf`` bucket (the highest finite bound),
a first bound ≤ 0, buckets with equal bounds (their counts added), cumulative counts
that decrease (raised to the running maximum), NaN counts, and buckets missing at
some steps (each step uses the buckets present then). The arithmetic is done in
the same order on float64, so the results are identical, not merely close
(``tests/test_quantile.py`` compares them with a real Prometheus).

Not reproduced, and reported as ``None`` (unsure) so the caller asks Prometheus:
``le`` values whose parsing could differ between Go's ``strconv.ParseFloat`` and
Python (NaN, hexadecimal, underscores, out of range) and three or more buckets
with one bound (the order of their addition is Prometheus' internal series order).
Prometheus ≥ 2.51 also flattens cumulative counts that differ by a relative 1e-12
(float noise of summed rates); a rank falling inside such a sliver is the one case
where a newer server's answer can differ from this one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

# what strconv.ParseFloat and float() read alike: plain decimals and infinities
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INF = re.compile(r"[+-]?(?:inf|infinity)", re.IGNORECASE)


def parse_le(text: str) -> float | None:
    """The bound Prometheus reads from an ``le`` label; ``nan`` when it skips the bucket
    (no label, malformed); ``None`` when kvwatch cannot be sure how Go parses it."""
    if _INF.fullmatch(text):
        return -math.inf if text.startswith("-") else math.inf
    if _DECIMAL.fullmatch(text):
        v = float(text)
        return v if math.isfinite(v) else None  # Go: out of range is an error (bucket skipped)
    if not text or not re.search(r"(?i)[0-9]|nan|inf|x|_", text):
        return math.nan  # no number at all: a parse error in Go as well
    return None


def _search(n: int, pred: object) -> int:
    """Go's ``sort.Search``: the binary search, also on a predicate that is not monotonic."""
    i, j = 0, n
    while i < j:
        h = (i + j) >> 1
        if not pred(h):  # type: ignore[operator]
            i = h + 1
        else:
            j = h
    return i


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """The ``q`` quantile of (upper bound, cumulative count) pairs in any order, as Prometheus computes it.

    Bounds must be distinct or pairwise equal at most (see the module docstring); no NaN bounds.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if not buckets:
        return math.nan
    bs = sorted(buckets, key=lambda b: b[0])
    if bs[-1][0] != math.inf:
        return math.nan
    merged: list[list[float]] = []
    for bound, count in bs:  # coalesceBuckets: equal bounds add their counts
        if merged and merged[-1][0] == bound:
            merged[-1][1] += count
        else:
            merged.append([bound, count])
    top = -math.inf
    for b in merged:  # ensureMonotonic (a NaN count neither raises nor is raised)
        if b[1] > top:
            top = b[1]
        elif b[1] < top:
            b[1] = top
    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    i = _search(len(merged) - 1, lambda k: merged[k][1] >= rank)
    if i == len(merged) - 1:
        return merged[-2][0]
    if i == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[i][0], merged[i][1]
    if i > 0:
        start = merged[i - 1][0]
        count -= merged[i - 1][1]
        rank -= merged[i - 1][1]
    with np.errstate(divide="ignore", invalid="ignore"):  # IEEE division, as Go's (x/0 is ±Inf or NaN)
        frac = float(np.float64(rank) / np.float64(count))
    return start + (end - start) * frac


def quantile_rows(qs: Sequence[float], bounds: np.ndarray, counts: np.ndarray, present: np.ndarray) -> np.ndarray:
    """``bucket_quantile`` of every quantile in ``qs`` for many histograms at once.

    ``bounds`` (B,): distinct bounds, ascending, no NaN. ``counts`` (N, B): cumulative counts
    of N histograms (one target at one step each); ``present`` (N, B): which buckets exist
    for that histogram (a missing bucket is left out, as Prometheus leaves out a series
    without a sample at that step). Returns (len(qs), N); NaN also where no bucket is present.
    Rows with every bucket present and no NaN count are computed as arrays; the rest one by one.
    """
    n, nb = counts.shape
    out = np.full((len(qs), n), np.nan)
    if not n or not nb:
        return out
    full = present.all(axis=1) & ~np.isnan(counts).any(axis=1)
    some = present.any(axis=1)
    for r in np.nonzero(some & ~full)[0]:
        pairs = [(float(bounds[k]), float(counts[r, k])) for k in range(nb) if present[r, k]]
        for j, q in enumerate(qs):
            out[j, r] = bucket_quantile(q, pairs)
    rows = np.nonzero(full)[0]
    usual = [j for j, q in enumerate(qs) if 0 <= q <= 1]
    for j in set(range(len(qs))) - set(usual):  # NaN, < 0, > 1: decided before the buckets are read
        out[j, rows] = bucket_quantile(qs[j], [(0.0, 0.0)])
    if not len(rows) or nb < 2 or bounds[-1] != math.inf:
        return out  # too few buckets or no +Inf bucket: NaN, as Prometheus answers
    c = np.maximum.accumulate(counts[rows], axis=1)  # ensureMonotonic on NaN-free rows
    obs = c[:, -1]
    idx = np.arange(len(rows))
    with np.errstate(divide="ignore", invalid="ignore"):
        for j in usual:
            q = qs[j]
            rank = q * obs
            # counts are non-decreasing now, so the first bucket holding the rank is sort.Search's answer
            ge = c[:, :-1] >= rank[:, None]
            b = np.where(ge.any(axis=1), ge.argmax(axis=1), nb - 1)
            prev = np.where(b > 0, c[idx, np.maximum(b - 1, 0)], 0.0)
            start = np.where(b > 0, bounds[np.maximum(b - 1, 0)], 0.0)
            end = bounds[np.minimum(b, nb - 1)]
            count = c[idx, np.minimum(b, nb - 1)] - prev
            val = start + (end - start) * ((rank - prev) / count)
            val = np.where(b == nb - 1, bounds[nb - 2], val)
            val = np.where((b == 0) & (bounds[0] <= 0), bounds[0], val)
            out[j, rows] = np.where(obs == 0, np.nan, val)
    return out
