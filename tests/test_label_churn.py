"""Label churn in stored data: a series replaced by a relabelled one is not counted twice.

When a label of a target's series changes (a pod hash, a version label after a rollout)
the old series stops. A live Prometheus marks it stale at the next scrape, but data that
were backfilled, federated or remote-written carry no staleness markers: the old series'
last value then stays visible for the 5-minute lookback, next to the new one, and a
``sum``/``max`` over the target's series doubles ``running`` and ``waiting`` and holds the
old KV value. kvwatch finds such targets with one query per KV family and re-reads their
gauges keeping only the series of the target's newest scrape. Real Prometheus, backfilled
OpenMetrics: each churned target yields the same grids as its unchurned twin.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pytest
from fixtures.core import fleet
from support.prom import backfill, prometheus
from support.victoria import import_openmetrics, victoriametrics

from kvwatch.config import load_settings
from kvwatch.core.churn import find_leftovers
from kvwatch.core.collect import collect
from kvwatch.core.discover import discover
from kvwatch.core.models import Target
from kvwatch.core.pipeline import collect_targets
from kvwatch.core.promclient import PromClient
from kvwatch.core.rules import load_ruleset
from kvwatch.core.signals import Signal
from kvwatch.errors import PrometheusBadResponse, PrometheusTimeout, PrometheusUnreachable

pytestmark = [pytest.mark.prometheus]

DIALECTS = ("vllm-0.33", "sglang-0.5", "trtllm-serve", "trtllm-triton")
GAUGES = (Signal.KV_USAGE, Signal.RUNNING, Signal.WAITING)
SPAN, INTERVAL = 2400.0, 15.0
CHURN_BEFORE_END = 900.0  # the relabel lands inside the 30-minute window, > 5 min before its end
RATE_WINDOW_S = 120.0


def _write(w: fleet._Writer, dialect: str, instance: str, times: list[float], t0: float, extra: dict[str, str]) -> None:
    fleet.write_engine(w, dialect, {"job": "churn", "instance": instance, **extra}, times, t0, "full")


@dataclass(frozen=True)
class Store:
    url: str
    at: datetime
    cut: float  # first sample of the relabelled series
    om: str = ""  # the OpenMetrics text backfilled


def _churned_fleet() -> tuple[str, float, float]:
    """OpenMetrics of a plain and a churned twin per dialect; the span's end; the relabel time."""
    end = math.floor((time.time() - 4 * 3600) / 600) * 600
    t0 = end - SPAN
    times = [t0 + k * INTERVAL for k in range(int(SPAN // INTERVAL) + 1)]
    cut = next(i for i, t in enumerate(times) if t >= end - CHURN_BEFORE_END)
    w = fleet._Writer()
    for d in DIALECTS:
        _write(w, d, f"{d}-plain:8000", times, t0, {})
        # same values, but the series change their pod_hash label at the cut
        _write(w, d, f"{d}-churned:8000", times[:cut], t0, {"pod_hash": "a"})
        _write(w, d, f"{d}-churned:8000", times[cut:], t0, {"pod_hash": "b"})
    return w.text(), end, times[cut]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    om, end, cut = _churned_fleet()
    work = tmp_path_factory.mktemp("churn")
    backfill(om, work / "data")
    with prometheus(tsdb=work / "data") as url:
        yield Store(url, datetime.fromtimestamp(end, tz=UTC), cut, om)


def _pair(store: Store, dialect: str) -> tuple[PromClient, str, list[Target]]:
    client = PromClient(store.url)
    sel = f'instance=~"{dialect}-(plain|churned):8000"'
    targets = sorted(discover(client, store.at, 1800.0, sel), key=lambda t: "churned" not in t.key.instance)
    assert [("churned" in t.key.instance) for t in targets] == [True, False], targets
    return client, sel, targets


@pytest.mark.parametrize("dialect", DIALECTS)
def test_plain_reading_counts_the_leftover(store: Store, dialect: str) -> None:
    """The defect, reproduced: the plain per-target aggregation reads both series for 5 minutes."""
    client, sel, (churned, plain) = _pair(store, dialect)
    data = collect(client, [churned, plain], at=store.at, window_s=1800.0, step_s=30.0,
                   rate_window=f"{RATE_WINDOW_S:g}s", user_matchers=sel)
    after = (data.grid >= store.cut) & (data.grid < store.cut + 300.0)
    diff = [~np.isclose(data.values(plain.key, s), data.values(churned.key, s), equal_nan=True) for s in GAUGES]
    assert any(d[after].any() for d in diff), dialect
    assert not any(d[~after].any() for d in diff), dialect


@pytest.mark.parametrize("dialect", DIALECTS)
def test_relabelled_series_are_not_summed_with_their_stale_predecessors(store: Store, dialect: str) -> None:
    client, sel, (churned, plain) = _pair(store, dialect)
    flagged = find_leftovers(client, [churned, plain], at=store.at, window_s=1800.0, step_s=30.0,
                             user_matchers=sel, fresh_s=1.5 * INTERVAL)
    assert flagged == [churned]
    settings = load_settings(None, environ={}, overrides={"discovery": {"selector": "{" + sel + "}"}})
    data = collect_targets(client, settings, load_ruleset(), [churned, plain], store.at)
    for sig in GAUGES:
        want, got = data.values(plain.key, sig), data.values(churned.key, sig)
        assert np.isfinite(want).mean() > 0.9, (sig, want)
        bad = ~np.isclose(want, got, equal_nan=True)
        assert not bad.any(), (dialect, sig.value, data.grid[bad] - store.cut, want[bad], got[bad])


def test_victoriametrics_reads_the_churned_twin_alike(store: Store) -> None:
    """The same data imported into VictoriaMetrics (``@ end()`` in the probe, its own lookback)."""
    with victoriametrics() as url:
        import_openmetrics(url, store.om)
        vm = Store(url, store.at, store.cut, store.om)
        for dialect in DIALECTS:
            client, sel, (churned, plain) = _pair(vm, dialect)
            settings = load_settings(None, environ={}, overrides={"discovery": {"selector": "{" + sel + "}"}})
            data = collect_targets(client, settings, load_ruleset(), [churned, plain], vm.at)
            for sig in GAUGES:
                want, got = data.values(plain.key, sig), data.values(churned.key, sig)
                assert np.isfinite(want).mean() > 0.9, (dialect, sig, want)
                assert np.allclose(want, got, equal_nan=True), (dialect, sig.value, want, got)


@pytest.mark.parametrize("error", [PrometheusBadResponse("http://p", "422: too many samples"), PrometheusTimeout("http://p", "probe: 30 s"),
                                   PrometheusBadResponse("http://p", "HTTP 422 bad_data: unknown modifier @", status=422)])
def test_a_store_that_refuses_the_probe_is_read_as_before(store: Store, error: Exception) -> None:
    """A long-term store without ``@``, a sample limit or a slow probe: no leftover is found and
    the gauges are read as before; an unreachable store still fails the cycle."""
    _, sel, (churned, plain) = _pair(store, "vllm-0.33")

    class Refusing(PromClient):
        def __init__(self, exc: Exception) -> None:
            super().__init__(store.url, timeout_s=30)
            self.exc = exc

        def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list:  # type: ignore[override]
            if "@ end()" in query:
                raise self.exc
            return super().range(query, start, end, step_s)

    assert find_leftovers(Refusing(error), [churned, plain], at=store.at, window_s=1800.0, step_s=30.0,
                          user_matchers=sel, fresh_s=1.5 * INTERVAL) == []
    with pytest.raises(PrometheusUnreachable):
        find_leftovers(Refusing(PrometheusUnreachable("http://p", "down")), [churned, plain], at=store.at, window_s=1800.0,
                       step_s=30.0, user_matchers=sel, fresh_s=1.5 * INTERVAL)
    # the query API's own error answer carries its status: a query it cannot parse is refused
    with pytest.raises(PrometheusBadResponse) as bad:
        PromClient(store.url).range("sum(", store.at, store.at, 30.0)
    assert bad.value.status == 400 and bad.value.refused
    # a server failure is no refusal: the cycle fails as for any other query, not silently partial
    # (test_faults_http: one HTTP 500 on the first range query, the probe's since it shares the pool)
    for failed in ("HTTP 500 : internal error", "HTTP 503 with a non-JSON body ('upstream down')"):
        with pytest.raises(PrometheusBadResponse):
            find_leftovers(Refusing(PrometheusBadResponse("http://p", failed)), [churned, plain], at=store.at,
                           window_s=1800.0, step_s=30.0, user_matchers=sel, fresh_s=1.5 * INTERVAL)


def test_the_backtest_history_reads_the_churned_twin_alike(store: Store) -> None:
    """`kvwatch backtest` fetches its whole span at once (kvwatch/tools/backtest/history.py):
    it must read the leftovers as `once --at t` does, or a replay differs from the instants."""
    from kvwatch.tools.backtest.history import HistorySpec, fetch_history

    for dialect in DIALECTS:
        client, sel, (churned, plain) = _pair(store, dialect)
        end = store.at.timestamp()
        data = fetch_history(client, [churned, plain], HistorySpec(
            start=end - 600.0, end=end, window_s=1800.0, resolution_s=30.0, rate_window="2m", user_matchers=sel))
        for sig in GAUGES:
            want, got = data.values(plain.key, sig), data.values(churned.key, sig)
            assert np.isfinite(want).mean() > 0.9, (dialect, sig, want)
            bad = ~np.isclose(want, got, equal_nan=True)
            assert not bad.any(), (dialect, sig.value, data.grid[bad] - store.cut, want[bad], got[bad])
