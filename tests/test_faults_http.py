"""Prometheus misbehaving on the wire: down, slow, 5xx, non-JSON, truncated,
dropped connections, partial answers with warnings.

A fault-injecting proxy (``support.fault_proxy``) sits in front of a real
Prometheus holding a small backfilled fleet.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fault_proxy import Fault, FaultMode, FaultProxy
from support.prom import backfill, free_port, prometheus
from test_faults_data import AT, Fleet

from kvwatch.cli import main
from kvwatch.config import Settings, load_settings
from kvwatch.core.models import FailureMode
from kvwatch.core.pipeline import evaluate
from kvwatch.core.promclient import PromClient
from kvwatch.core.rules import RuleSet, load_ruleset
from kvwatch.errors import (
    PrometheusBadResponse,
    PrometheusError,
    PrometheusUnreachable,
)

pytestmark = pytest.mark.prometheus
AT_TEXT = AT.isoformat().replace("+00:00", "Z")


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultProxy]:
    f = Fleet()
    for i in range(3):
        f.target(f"t{i}:8000", kv=lambda j, i=i: 0.3 + 0.1 * i + 0.02 * math.sin(j / 5))
    tsdb: Path = tmp_path_factory.mktemp("faults-http") / "tsdb"
    backfill(f.text(), tsdb)
    with prometheus(tsdb=tsdb) as url, FaultProxy(url) as p:
        yield p


@pytest.fixture(autouse=True)
def _reset(proxy: FaultProxy) -> Iterator[None]:
    proxy.clear()
    yield
    proxy.clear()


@pytest.fixture(scope="module")
def rules() -> RuleSet:
    return load_ruleset()


def _settings(url: str) -> Settings:
    return load_settings(None, environ={}, overrides={"prometheus": {"url": url}})


def _evaluate(url: str, rules: RuleSet, *, timeout_s: float = 5.0, retries: int = 0) -> Any:
    client = PromClient(url, timeout_s=timeout_s, retries=retries)
    return evaluate(client, _settings(url), rules, AT)


def test_through_the_proxy_unfaulted(proxy: FaultProxy, rules: RuleSet) -> None:
    ev = _evaluate(proxy.url, rules)
    assert sorted(r.target.key.instance for r in ev.results) == ["t0:8000", "t1:8000", "t2:8000"]
    assert all(r.state is not FailureMode.UNKNOWN for r in ev.results)
    assert ev.warnings == ()


def test_prometheus_down_exits_3_naming_the_url(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    code = main(["once", "--prometheus-url", url, "--at", AT_TEXT])
    assert code == 3
    err = capsys.readouterr().err
    assert url in err and "unreachable" in err
    assert time.monotonic() - t0 < 10


def test_slow_prometheus_times_out_in_bounded_time(
    proxy: FaultProxy, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proxy.set(Fault(FaultMode.LATENCY, delay_s=4))
    cfg = tmp_path / "kvwatch.yaml"
    cfg.write_text(f"prometheus:\n  url: {proxy.url}\n  timeout: 1s\n  retries: 2\n")
    t0 = time.monotonic()
    code = main(["once", "--config", str(cfg), "--at", AT_TEXT])
    elapsed = time.monotonic() - t0
    assert code == 3
    err = capsys.readouterr().err
    assert proxy.url in err and "no answer within 1s" in err
    assert elapsed < 3.0, f"timeout not enforced: {elapsed:.1f}s"  # read timeouts are not retried


@pytest.mark.parametrize("status", [500, 502, 503])
def test_http_5xx_is_a_prometheus_error(proxy: FaultProxy, rules: RuleSet, status: int) -> None:
    proxy.set(Fault(FaultMode.STATUS, status=status, body=b"<html>upstream broke</html>"))
    with pytest.raises(PrometheusBadResponse) as exc:
        _evaluate(proxy.url, rules)
    assert f"HTTP {status}" in str(exc.value) and proxy.url in str(exc.value)


def test_transient_503_is_retried(proxy: FaultProxy, rules: RuleSet) -> None:
    proxy.set(Fault(FaultMode.STATUS, status=503, path_contains="/query_range", times=1))
    ev = _evaluate(proxy.url, rules, retries=1)
    assert len(ev.results) == 3
    assert all(r.state is not FailureMode.UNKNOWN for r in ev.results)


def test_non_json_body(proxy: FaultProxy, rules: RuleSet) -> None:
    proxy.set(Fault(FaultMode.GARBAGE, body=b"\x00\xffnot json at all"))
    with pytest.raises(PrometheusBadResponse, match="non-JSON"):
        _evaluate(proxy.url, rules)


def test_json_that_is_not_an_api_answer(proxy: FaultProxy, rules: RuleSet) -> None:
    proxy.set(Fault(FaultMode.GARBAGE, body=b'{"status": "success", "data": {"result": 7}}'))
    with pytest.raises(PrometheusBadResponse, match=r"no data\.result list"):
        _evaluate(proxy.url, rules)


@pytest.mark.parametrize("announce_full_length", [False, True])
def test_truncated_body(proxy: FaultProxy, rules: RuleSet, announce_full_length: bool) -> None:
    proxy.set(Fault(FaultMode.TRUNCATE, fraction=0.6, truncate_header=announce_full_length))
    t0 = time.monotonic()
    with pytest.raises(PrometheusError) as exc:
        _evaluate(proxy.url, rules, timeout_s=3)
    assert proxy.url in str(exc.value)
    assert time.monotonic() - t0 < 5


def test_dropped_connection(proxy: FaultProxy, rules: RuleSet) -> None:
    proxy.set(Fault(FaultMode.DROP))
    with pytest.raises((PrometheusUnreachable, PrometheusBadResponse)) as exc:
        _evaluate(proxy.url, rules)
    assert proxy.url in str(exc.value)


def test_one_failed_query_fails_the_cycle_not_silently_partial(proxy: FaultProxy, rules: RuleSet) -> None:
    proxy.set(Fault(FaultMode.STATUS, status=500, path_contains="/query_range", times=1))
    with pytest.raises(PrometheusBadResponse):
        _evaluate(proxy.url, rules)


def test_partial_answer_warnings_are_surfaced_per_cycle(proxy: FaultProxy, rules: RuleSet) -> None:
    def partial(doc: dict[str, Any]) -> dict[str, Any]:
        doc["warnings"] = ["partial response: store gateway unavailable"]
        doc["data"]["result"] = [r for r in doc["data"]["result"] if r["metric"].get("instance") != "t1:8000"]
        return doc

    proxy.set(Fault(FaultMode.REWRITE, rewrite=partial, path_contains="/query_range"))
    client = PromClient(proxy.url, timeout_s=5, retries=0)
    ev = evaluate(client, _settings(proxy.url), rules, AT)
    assert ev.warnings == ("partial response: store gateway unavailable",)
    t1 = next(r for r in ev.results if r.target.key.instance == "t1:8000")
    assert t1.state is FailureMode.UNKNOWN  # its series were dropped: not silently healthy
    assert "kv_usage (no data)" in t1.missing_signals
    # the same client in the next cycle: old warnings do not leak into it
    proxy.clear()
    ev2 = evaluate(client, _settings(proxy.url), rules, AT)
    assert ev2.warnings == ()
    assert len(client.stats.warnings) <= 50
