"""Bad data in a real Prometheus: NaN/±Inf, counter resets, scrape gaps, vanished
targets, duplicate series after relabelling, label values that need escaping.

One small fleet is backfilled with promtool (each target carries one fault) and
evaluated through the real pipeline at a past instant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from support.prom import backfill, prometheus

from kvwatch.config import load_settings
from kvwatch.core.collect import collect
from kvwatch.core.discover import discover
from kvwatch.core.models import Evaluation, FailureMode, TargetKey, TargetResult
from kvwatch.core.pipeline import evaluate
from kvwatch.core.promclient import PromClient
from kvwatch.core.rules import load_ruleset
from kvwatch.core.selector import parse_selector, render_matchers
from kvwatch.core.signals import Signal
from kvwatch.core.statistics.series import SeriesStats

pytestmark = pytest.mark.prometheus

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
STEP = 15
N = 40 * 60 // STEP + 1  # 40 minutes of samples
AT = T0 + timedelta(seconds=STEP * (N - 1))
WEIRD_NS = 'llm "prod" \\ ü'
WEIRD_INSTANCE = 'weird"\\ü:8000'
BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0)

Values = Callable[[int], float | None]  # sample index → value (None: no sample)


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(d: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in d.items()) + "}"


def _num(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


class Fleet:
    """OpenMetrics families keyed by name; each target adds its samples."""

    def __init__(self) -> None:
        self.fams: dict[str, tuple[str, list[str]]] = {}

    def _add(self, family: str, kind: str, sample: str, labels: dict[str, str], fn: Values) -> None:
        lines = self.fams.setdefault(family, (kind, []))[1]
        lab = _labels(labels)
        for i in range(N):
            v = fn(i)
            if v is not None:
                lines.append(f"{sample}{lab} {_num(v)} {T0.timestamp() + i * STEP:.0f}")

    def target(
        self,
        instance: str,
        *,
        kv: Values,
        preempt_total: Values = lambda i: 0.0,
        waiting: Values = lambda i: 0.0,
        job: str = "vllm",
        extra: dict[str, str] | None = None,
        present: Callable[[int], bool] = lambda i: True,
    ) -> None:
        # one model per target: replica-group rules (misread imbalance) stay out of these tests
        base = {"job": job, "instance": instance, "model_name": f"m-{instance}", **(extra or {})}

        def gate(fn: Values) -> Values:
            return lambda i: fn(i) if present(i) else None

        self._add("vllm:kv_cache_usage_perc", "gauge", "vllm:kv_cache_usage_perc", base, gate(kv))
        self._add("vllm:num_requests_running", "gauge", "vllm:num_requests_running", base, gate(lambda i: 8.0))
        self._add("vllm:num_requests_waiting", "gauge", "vllm:num_requests_waiting", base, gate(waiting))
        self._add("vllm:num_preemptions", "counter", "vllm:num_preemptions_total", base, gate(preempt_total))
        fam = "vllm:time_to_first_token_seconds"
        shares = (0.2, 0.7, 0.95, 1.0, 1.0, 1.0, 1.0)  # cumulative share at or below each `le`
        for le, share in zip((*BUCKETS, math.inf), shares, strict=True):
            lab = {**base, "le": "+Inf" if math.isinf(le) else repr(le)}
            self._add(fam, "histogram", f"{fam}_bucket", lab, gate(lambda i, s=share: 2.0 * i * s))
        self._add(fam, "histogram", f"{fam}_count", base, gate(lambda i: 2.0 * i))
        self._add(fam, "histogram", f"{fam}_sum", base, gate(lambda i: 1.5 * i))

    def text(self) -> str:
        out: list[str] = []
        for fam, (kind, lines) in self.fams.items():
            out.append(f"# TYPE {fam} {kind}")
            out.extend(lines)
        out.append("# EOF")
        return "\n".join(out) + "\n"


def _fleet() -> Fleet:
    f = Fleet()
    f.target("ok:8000", kv=lambda i: 0.5 + 0.05 * math.sin(i / 7))
    f.target("full:8000", kv=lambda i: 0.97, waiting=lambda i: 5.0, preempt_total=lambda i: 1.0 * STEP * i)
    # same as full, but not scraped for 15 minutes in the middle of the window
    f.target(
        "gappy:8000",
        kv=lambda i: 0.97,
        waiting=lambda i: 5.0,
        preempt_total=lambda i: 1.0 * STEP * i,
        present=lambda i: not (60 <= i < 120),
    )
    # stops reporting 20 minutes before the evaluation instant
    f.target("gone:8000", kv=lambda i: 0.5, present=lambda i: i < N - 80)
    # engine restart at sample 100: the counter drops to 0 and climbs again at 2/s
    f.target("reset:8000", kv=lambda i: 0.6, preempt_total=lambda i: 2.0 * STEP * (i if i < 100 else i - 100))
    # every 4th sample NaN, a few ±Inf
    f.target(
        "nan:8000",
        kv=lambda i: math.nan if i % 4 == 0 else (math.inf if i % 37 == 1 else (-math.inf if i % 41 == 2 else 0.95)),
    )
    # two series per metric for one job/instance (e.g. scraped twice, relabelled onto the same target)
    f.target("dup:8000", kv=lambda i: 0.4, extra={"replica": "a"})
    f.target("dup:8000", kv=lambda i: 0.6, extra={"replica": "b"})
    f.target(WEIRD_INSTANCE, kv=lambda i: 0.3, job="vllm-ü", extra={"namespace": WEIRD_NS})
    return f


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tsdb: Path = tmp_path_factory.mktemp("faults-data") / "tsdb"
    backfill(_fleet().text(), tsdb)
    with prometheus(tsdb=tsdb) as url:
        yield url


def _settings(url: str, selector: str = "") -> object:
    over = {"prometheus": {"url": url, "timeout": "10s", "retries": 0}, "discovery": {"selector": selector}}
    return load_settings(None, environ={}, overrides=over)


@pytest.fixture(scope="module")
def evaluation(prom_url: str) -> Evaluation:
    client = PromClient(prom_url, timeout_s=10, retries=0)
    return evaluate(client, _settings(prom_url), load_ruleset(), AT)  # type: ignore[arg-type]


def _result(ev: Evaluation, instance: str) -> TargetResult:
    found = [r for r in ev.results if r.target.key.instance == instance]
    assert len(found) == 1, f"{instance}: {len(found)} results ({[r.target.key for r in ev.results]})"
    return found[0]


def _series(prom_url: str, instance: str, sig: Signal) -> np.ndarray:
    client = PromClient(prom_url, timeout_s=10, retries=0)
    targets = [t for t in discover(client, AT, 1800, "") if t.key.instance == instance]
    data = collect(client, targets, at=AT, window_s=1800, step_s=STEP, rate_window="2m", user_matchers="")
    vals = data.values(targets[0].key, sig)
    assert vals is not None, f"{instance}: no {sig.value} series"
    return vals


def test_baseline_targets_classify(evaluation: Evaluation) -> None:
    assert _result(evaluation, "ok:8000").state is FailureMode.HEALTHY
    assert _result(evaluation, "full:8000").state is FailureMode.FULL


def test_vanished_target_is_unknown_not_healthy(evaluation: Evaluation) -> None:
    r = _result(evaluation, "gone:8000")
    assert r.target.dialect == "stale"
    assert r.state is FailureMode.UNKNOWN
    assert "no engine metrics exist now" in r.diagnoses[0].summary


def test_scrape_gap_lowers_confidence_without_changing_the_verdict(evaluation: Evaluation) -> None:
    full, gappy = _result(evaluation, "full:8000"), _result(evaluation, "gappy:8000")
    assert gappy.state is FailureMode.FULL
    assert gappy.primary is not None and full.primary is not None
    assert gappy.primary.confidence < full.primary.confidence


def test_nan_and_inf_are_missing_not_zero(prom_url: str, evaluation: Evaluation) -> None:
    kv = _series(prom_url, "nan:8000", Signal.KV_USAGE)
    assert not np.any(kv == 0.0), "NaN samples must never turn into 0"
    assert np.isnan(kv).sum() >= len(kv) // 5  # every 4th sample is NaN upstream
    stats = SeriesStats(np.arange(len(kv), dtype=float), kv, expected=len(kv))
    assert stats.mean == pytest.approx(0.95)
    assert stats.max == pytest.approx(0.95)  # +Inf ignored
    assert _result(evaluation, "nan:8000").state is not FailureMode.UNKNOWN


def test_counter_reset_keeps_preemption_rate_sane(prom_url: str) -> None:
    rate = _series(prom_url, "reset:8000", Signal.PREEMPTIONS)
    ok = rate[np.isfinite(rate)]
    assert len(ok) > 0.9 * len(rate)
    assert ok.min() >= 0.0
    assert ok.max() == pytest.approx(2.0, rel=0.1)  # no spike from the drop to 0


def test_duplicate_series_aggregate_to_one_target(prom_url: str, evaluation: Evaluation) -> None:
    r = _result(evaluation, "dup:8000")
    assert r.state is not FailureMode.UNKNOWN
    kv = _series(prom_url, "dup:8000", Signal.KV_USAGE)
    assert np.nanmax(kv) == pytest.approx(0.6)  # max over duplicates, never their sum
    ttft = _series(prom_url, "dup:8000", Signal.TTFT_P99)
    assert np.isfinite(ttft).any() and np.nanmax(ttft) <= BUCKETS[-1]
    running = _series(prom_url, "dup:8000", Signal.RUNNING)
    # `sum by (job, instance)` counts duplicated gauges twice: documented in docs/operations.md
    assert np.nanmax(running) == pytest.approx(16.0)


def test_label_values_needing_escaping(prom_url: str, evaluation: Evaluation) -> None:
    weird = _result(evaluation, WEIRD_INSTANCE)
    assert weird.target.key == TargetKey("vllm-ü", WEIRD_INSTANCE)
    assert weird.state is FailureMode.HEALTHY
    selector = '{namespace="llm \\"prod\\" \\\\ ü"}'
    assert parse_selector(selector)[0].value == WEIRD_NS
    client = PromClient(prom_url, timeout_s=10, retries=0)
    ev = evaluate(client, _settings(prom_url, selector), load_ruleset(), AT)  # type: ignore[arg-type]
    assert [r.target.key.instance for r in ev.results] == [WEIRD_INSTANCE]
    assert ev.results[0].state is FailureMode.HEALTHY
    # a selector that matches nothing yields no targets, not an error
    none = render_matchers(parse_selector('{namespace="llm \\"prod\\""}'))
    assert discover(client, AT, 1800, none) == []
