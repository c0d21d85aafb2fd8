"""kvwatch's ``histogram_quantile`` (``core/quantile.py``) equals a real Prometheus' to the bit.

Bucket sets are written as PromQL vectors (``label_replace(vector(count), "le", bound, …)``), so
one query asks Prometheus for the quantile of hundreds of random histograms: missing ``+Inf``
buckets, single buckets, zero counts, decreasing cumulative counts, NaN counts, bounds ≤ 0,
two spellings of one bound, ranks exactly on a bucket's count, quantiles outside [0, 1].
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from datetime import UTC, datetime

import numpy as np
import pytest
from support.prom import prometheus, require_binary

from kvwatch.core.collect import family_quantiles
from kvwatch.core.models import TargetKey
from kvwatch.core.promclient import PromClient
from kvwatch.core.quantile import bucket_quantile, parse_le, quantile_rows

QS = (0.5, 0.99, 0.0, 1.0, 0.9, -0.5, 1.5)
BOUNDS = (-1.0, 0.0, 0.001, 0.005, 0.02, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0)


def _num(x: float) -> str:
    return "NaN" if math.isnan(x) else ("+Inf" if x == math.inf else "-Inf" if x == -math.inf else repr(x))


def _case(rng: random.Random) -> tuple[list[tuple[str, float]], list[bool]]:
    """(le text, cumulative count) of one random histogram, and which buckets are present."""
    bounds = sorted(rng.sample(BOUNDS, rng.randint(0, 7)))
    texts = [repr(b) for b in bounds]
    if rng.random() < 0.85:
        texts.append("+Inf")
    if texts and rng.random() < 0.1:  # a second spelling of one finite bound
        b = rng.choice(bounds) if bounds else None
        if b is not None:
            texts.append(f"{b:.6e}")
    style = rng.random()
    counts: list[float] = []
    total = 0.0
    for _ in texts:
        if style < 0.3:
            total += rng.randint(0, 3)  # integers: ranks land exactly on counts
        elif style < 0.4:
            total = 0.0  # no observations
        else:
            total += rng.random() * rng.choice((1e-3, 1.0, 50.0))
        counts.append(total)
    # the duplicate spelling and the +Inf bucket come last in texts; sort the counts to the bounds
    order = sorted(range(len(texts)), key=lambda i: float(texts[i]))
    counts = sorted(counts)
    pairs = [(texts[i], counts[k]) for k, i in enumerate(order)]
    if rng.random() < 0.25 and len(pairs) > 1:  # decreasing cumulative counts (rate noise, resets)
        i = rng.randrange(len(pairs) - 1)
        pairs[i] = (pairs[i][0], pairs[i][1] + rng.choice((0.5, 2.0, 1e-9)))
    if rng.random() < 0.05 and pairs:
        i = rng.randrange(len(pairs))
        pairs[i] = (pairs[i][0], math.nan)
    present = [rng.random() > 0.1 for _ in pairs]
    return pairs, present


@pytest.fixture(scope="module")
def prom() -> Iterator[PromClient]:
    require_binary("prometheus")
    with prometheus() as url:
        yield PromClient(url, timeout_s=30)


def _promql(q: float, cases: list[list[tuple[str, float]]]) -> str:
    parts = [
        f'label_replace(label_replace(vector({_num(c)}), "le", "{le}", "", ""), "case", "{i}", "", "")'
        for i, pairs in enumerate(cases) for le, c in pairs
    ]
    return f"histogram_quantile({_num(q)}, {' or '.join(parts)})"


@pytest.mark.prometheus
def test_bucket_quantile_equals_prometheus_bit_for_bit(prom: PromClient) -> None:
    rng = random.Random(15)
    cases, shown = [], []
    for _ in range(400):
        pairs, present = _case(rng)
        if any(present):
            cases.append((pairs, present))
            shown.append([p for p, keep in zip(pairs, present, strict=True) if keep])
    at = datetime(2026, 1, 1, tzinfo=UTC)
    checked = vector_checked = 0
    for q in QS:
        answer = {r["metric"]["case"]: float(r["value"][1]) for r in prom.instant(_promql(q, shown), at)}
        assert len(answer) == len(shown)  # one answer per histogram with a bucket
        for i, ((pairs, present), visible) in enumerate(zip(cases, shown, strict=True)):
            want = answer[str(i)]
            got = bucket_quantile(q, [(float(le), c) for le, c in visible])
            assert np.array_equal([got], [want], equal_nan=True), (q, visible, got, want)
            checked += 1
            bounds = [float(le) for le, _ in pairs]
            if len(set(bounds)) == len(bounds):  # the array path takes distinct bounds
                order = np.argsort(bounds)
                rows = quantile_rows([q], np.array(bounds)[order], np.array([[c for _, c in pairs]])[:, order],
                                     np.array([present])[:, order])
                assert np.array_equal(rows[0], [want], equal_nan=True), (q, pairs, present, rows, want)
                vector_checked += 1
    assert checked == len(QS) * len(shown) and vector_checked > len(QS) * 300


def test_quantile_rows_computes_many_histograms_at_once() -> None:
    bounds = np.array([0.1, 0.5, 1.0, math.inf])
    counts = np.array([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0], [5.0, 4.0, 6.0, 6.0], [1.0, 2.0, 3.0, 4.0]])
    present = np.array([[True] * 4, [True] * 4, [True] * 4, [True, False, True, True]])
    out = quantile_rows([0.5, 0.99], bounds, counts, present)
    for j, q in enumerate((0.5, 0.99)):
        for r in range(4):
            pairs = [(float(b), float(c)) for b, c, p in zip(bounds, counts[r], present[r], strict=True) if p]
            assert np.array_equal([out[j, r]], [bucket_quantile(q, pairs)], equal_nan=True)
    assert out[0, 0] == 0.1 + (0.5 - 0.1) * ((2.0 - 1.0) / 1.0)  # rank 2 at the top of (0.1, 0.5]
    assert math.isnan(out[0, 1])  # nothing observed
    # 4 after 5 is raised to 5 (ensureMonotonic): rank 5.94 lies in (0.5, 1.0]
    assert out[1, 2] == 0.5 + (1.0 - 0.5) * ((0.99 * 6.0 - 5.0) / (6.0 - 5.0))


def test_parse_le_is_sure_only_where_go_and_python_agree() -> None:
    assert parse_le("0.25") == 0.25 and parse_le("+Inf") == math.inf and parse_le("-inf") == -math.inf
    assert parse_le("1e-3") == 0.001 and parse_le(".5") == 0.5 and parse_le("5.") == 5.0
    assert math.isnan(parse_le("")) and math.isnan(parse_le("abc"))  # Go skips the bucket too
    for unsure in ("NaN", "0x1p-2", "1_0", " 1", "1e999", "1a"):
        assert parse_le(unsure) is None, unsure


def test_family_quantiles_leaves_what_it_cannot_reproduce_to_prometheus() -> None:
    grid = np.array([0.0, 30.0])

    def row(inst: str, le: str, v: float) -> dict[str, object]:
        return {"metric": {"job": "j", "instance": inst, "le": le}, "values": [[0.0, str(v)], [30.0, str(v)]]}

    rows = [row("a", "0.1", 1), row("a", "+Inf", 2),
            row("b", "NaN", 1), row("b", "+Inf", 2),  # Go reads a NaN bound: Prometheus decides
            row("c", "1", 1), row("c", "1.0", 1), row("c", "1.00", 1), row("c", "+Inf", 4),  # three "1"s
            row("d", "1", 1), row("d", "1.0", 1), row("d", "+Inf", 4)]  # two: coalesced here
    out, unsure = family_quantiles(rows, grid, 30.0, False, [0.5])
    assert unsure == {TargetKey("j", "b"), TargetKey("j", "c")}
    assert out[TargetKey("j", "a")][0].tolist() == [0.1, 0.1]
    want = bucket_quantile(0.5, [(1.0, 2.0), (math.inf, 4.0)])
    assert out[TargetKey("j", "d")][0].tolist() == [want, want] == [1.0, 1.0]


class _Fake:
    """Answers the TTFT bucket query of two vLLM targets (``b`` with a bound Go reads as NaN)
    and Prometheus' own quantiles for ``b``; nothing for the other signals."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def _rows(self, query: str, points: list[float]) -> list[dict[str, object]]:
        if query.startswith("sum by (job, instance, le) (rate(vllm:time_to_first_token_seconds_bucket"):
            buckets = {"a": (("0.1", 2.0), ("1", 4.0), ("+Inf", 4.0)), "b": (("NaN", 1.0), ("+Inf", 4.0))}
            return [{"metric": {"job": "j", "instance": i, "le": le}, "values": [[t, repr(c)] for t in points]}
                    for i, bs in buckets.items() for le, c in bs]
        if query.startswith("histogram_quantile(") and 'instance=~"b"' in query and "time_to_first" in query:
            return [{"metric": {"job": "j", "instance": "b"}, "values": [[t, "7.5"] for t in points]}]
        return []

    def instant(self, query: str, at: datetime) -> list[dict[str, object]]:
        self.sent.append(query)
        return [{"metric": r["metric"], "value": r["values"][-1]} for r in self._rows(query, [at.timestamp()])]

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[dict[str, object]]:
        self.sent.append(query)
        n = round((end - start).total_seconds() / step_s)
        return self._rows(query, [start.timestamp() + i * step_s for i in range(n + 1)])


def test_collect_asks_prometheus_for_buckets_it_cannot_interpolate() -> None:
    from kvwatch.core.collect import collect
    from kvwatch.core.dialects import DIALECT_BY_ID
    from kvwatch.core.models import Target
    from kvwatch.core.signals import Signal

    names = frozenset(n for srcs in DIALECT_BY_ID["vllm-v1"].sources.values() for s in srcs for n in s.requires)
    targets = [Target(TargetKey("j", i), "vllm-v1", "vllm", names=names) for i in ("a", "b")]
    fake = _Fake()
    at = datetime(2026, 1, 1, tzinfo=UTC)
    data = collect(fake, targets, at=at, window_s=300.0, step_s=30.0, rate_window="2m", latency_window="10m",
                   user_matchers="", ceilings={}, layouts={})
    a, b = TargetKey("j", "a"), TargetKey("j", "b")
    # a: rank 2 (p50 of 4) is the top of the first bucket; rank 3.96 lies in (0.1, 1]
    assert data.values(a, Signal.TTFT_P50)[-1] == 0.1
    assert data.values(a, Signal.TTFT_P99)[-1] == 0.1 + (1.0 - 0.1) * ((0.99 * 4.0 - 2.0) / (4.0 - 2.0))
    assert data.values(b, Signal.TTFT_P50)[-1] == data.values(b, Signal.TTFT_P99)[-1] == 7.5
    asked = [q for q in fake.sent if q.startswith("histogram_quantile(") and "time_to_first" in q]
    assert len(asked) == 2 and all('instance=~"b"' in q for q in asked), asked  # only b, p50 and p99
