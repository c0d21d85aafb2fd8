"""Quantiles past the last finite bucket (issue 11, item 7) against a real Prometheus.

vLLM 0.8.2's TTFT histogram ends at ``le=10``. ``histogram_quantile`` then answers 10 for
any quantile that falls into ``+Inf``: kvwatch must say "> 10", keep derived ratios as
bounds (or unknown), and still decide what a bound decides.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from fixtures.core import fleet
from support.prom import backfill, prometheus

from kvwatch.config import load_settings
from kvwatch.core.bounds import straddled
from kvwatch.core.models import FailureMode, Verdict
from kvwatch.core.pipeline import evaluate
from kvwatch.core.promclient import PromClient
from kvwatch.core.report import to_json, to_text
from kvwatch.core.rules import load_ruleset

pytestmark = [pytest.mark.prometheus]

#: every request takes about a minute: p50 and p99 are both beyond the top bucket (10 s)
SLOW = fleet.Profile("slow", kv=0.3, running=8, req_rate=1.0, ttft_median=60.0, ttft_sigma=0.3)
#: a fine median and a tail beyond the top bucket: the misread signature, p99 only a bound
TAIL = fleet.Profile("tail", kv=0.3, running=8, req_rate=2.0, ttft_median=0.3, ttft_sigma=1.9)
#: a fine median and a true p99 of 1.85 s (under the 2 s SLO) whose rank falls into the
#: (1.0, 2.5] bucket: ``histogram_quantile`` interpolates it to ~2.3 s, over the SLO
STRADDLE = fleet.Profile("straddle", kv=0.3, running=8, req_rate=2.0, ttft_median=0.15, ttft_sigma=1.08)


def _render(w: fleet._Writer, instance: str, profile: fleet.Profile, end: float) -> None:
    fn, engine_labels = fleet.EXPOSITIONS["vllm-0.8.2"]
    t0 = end - 2400.0
    times = [t0 + i * fleet.INTERVAL_S for i in range(int(2400 // fleet.INTERVAL_S) + 1)]
    base = {"job": "vllm", "instance": instance}
    base |= {k: v.format(model="m") for k, v in engine_labels.items()}
    fn(fleet._Ctx(w, base, times, t0, profile, 1.0, 0))


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    end = math.floor((time.time() - 4 * 3600) / 600) * 600
    w = fleet._Writer()
    _render(w, "slow:8000", SLOW, end)
    _render(w, "tail:8000", TAIL, end)
    _render(w, "straddle:8000", STRADDLE, end)
    work = tmp_path_factory.mktemp("bounds")
    backfill(w.text(), work / "data")
    with prometheus(tsdb=work / "data") as url:
        at = datetime.fromtimestamp(end, tz=UTC)
        yield evaluate(PromClient(url), load_settings(None, environ={}), load_ruleset(), at)


def _target(ev, instance: str):
    return next(r for r in ev.results if r.target.key.instance == instance)


def test_quantile_beyond_the_last_bucket_renders_as_a_lower_bound(evaluation) -> None:
    r = _target(evaluation, "slow:8000")
    # a bound still decides what it bounds: p50 > 10 s is above the 2 s SLO
    assert r.state is FailureMode.IDLE and r.primary is not None and r.primary.cause == "compute_bound"
    assert "TTFT p50 > 10.00s" in r.primary.summary, r.primary.summary
    p50 = next(e for e in r.primary.evidence if e.signal == "ttft_p50")
    assert p50.lower_bound and p50.observed == pytest.approx(10.0) and p50.passed
    doc = json.loads(to_json(evaluation))
    t = next(x for x in doc["targets"] if x["labels"]["instance"] == "slow:8000")
    assert any(e["signal"] == "ttft_p50" and e["lower_bound"] for d in t["diagnoses"] for e in d["evidence"])
    assert "TTFT p50 > 10.00s" in to_text(evaluation)
    assert "10.00s (p50 10.00s)" not in to_text(evaluation)  # the old fake numbers


def test_tail_ratio_is_a_bound_not_a_fake_number(evaluation) -> None:
    slow = _target(evaluation, "slow:8000")
    # p50 and p99 both clamp at 10 s: 10/10 = 1 would be a fake ratio; with the mean far above
    # the SLO the tail rule is still decided (not misread), without using the ratio
    tail_rule = next(c for c in slow.checks if c.rule_id == "misread-ttft-tail")
    assert tail_rule.verdict is Verdict.NOT_MATCHED
    r = _target(evaluation, "tail:8000")
    # the misread rule is not defeated: p99 ≥ 10 s over a 0.3 s median is a ratio of at least ~30
    assert r.state is FailureMode.MISREAD, (r.state, r.primary and r.primary.summary)
    assert "p99 is > 10.00s" in r.primary.summary and "(> " in r.primary.summary
    ratio = next(e for e in r.primary.evidence if e.signal == "ttft_tail_ratio")
    assert ratio.lower_bound and ratio.observed >= 10


def test_a_quantile_in_the_slo_bucket_does_not_establish_the_slo_breach(evaluation) -> None:
    """The SLO (2 s) lies inside the bucket (1.0, 2.5] the p99 rank falls into: the
    interpolated 2.3 s says only "between 1 and 2.5 s", so "p99 > SLO" is not established:
    never a misread diagnosis (the true p99 here is 1.85 s), and not `unknown` either — the
    signal is there, its resolution cannot show a breach; calling such pools unknown opened
    a blind-spot incident on a healthy trtllm-serve control for 87 of 141 steps
    (benchmarks/detection.py)."""
    r = _target(evaluation, "straddle:8000")
    assert r.state is FailureMode.HEALTHY, r.primary and r.primary.summary
    for rule in ("misread-ttft-tail", "misread-ttft-tail-settled"):
        check = next(c for c in r.checks if c.rule_id == rule)
        assert check.verdict is Verdict.NOT_MATCHED and "ttft_p99" not in check.unknown, (rule, check)
    # a tail past the SLO's bucket is still decided
    assert _target(evaluation, "tail:8000").state is FailureMode.MISREAD


@pytest.mark.parametrize(
    ("value", "threshold", "expected"),
    [
        (2.018, 2.0, (1.0, 2.5)),  # the corpus case: the SLO inside the quantile's bucket
        (1.4, 2.0, (1.0, 2.5)),  # below the threshold, same bucket: just as undecided
        (2.5, 2.0, (1.0, 2.5)),  # on the bucket's upper edge: still in (1.0, 2.5]
        (2.6, 2.0, None),  # past the edge that is >= the threshold: decided (over)
        (0.9, 2.0, None),  # at most the edge below the threshold: decided (under)
        (2.4, 2.5, None),  # a threshold on an edge is decided by the bucket
        (0.05, 0.08, (0.0, 0.1)),  # below the first bound the bucket starts at 0
        (12.0, 2.0, None),  # past the top bound: a clamp (lower bound), not a bucket
    ],
)
def test_straddled_names_the_bucket_only_when_the_threshold_is_inside(value, threshold, expected) -> None:
    assert straddled(value, threshold, (0.1, 1.0, 2.5, 5.0, 10.0)) == expected
