"""Collection's CPU shortcuts leave results and process state as they were (benchmarks/README.md, session 8)."""

from __future__ import annotations

import gc
from datetime import UTC, datetime
from typing import Any

import pytest

from kvwatch.core.collect import collect, gc_paused
from kvwatch.core.models import Target, TargetKey
from kvwatch.errors import PrometheusBadResponse

AT = datetime(2025, 3, 1, tzinfo=UTC)
TARGETS = [Target(TargetKey("j", "i"), "vllm-v1", "vllm", names=frozenset({"vllm:kv_cache_usage_perc"}))]


class _Client:
    """Answers every query with one KV usage series; records whether the cyclic GC was on."""

    url = "http://fake"

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.gc_seen = fail, []

    def _answer(self) -> list[dict[str, Any]]:
        self.gc_seen.append(gc.isenabled())
        if self.fail:
            raise PrometheusBadResponse(self.url, "HTTP 422 execution: boom")
        t = AT.timestamp()
        return [{"metric": {"job": "j", "instance": "i"}, "values": [[t - 30, "0.5"], [t, "0.75"]]}]

    def instant(self, query: str, at: datetime) -> list[dict[str, Any]]:
        return self._answer()

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[dict[str, Any]]:
        return self._answer()


def _collect(client: _Client) -> Any:
    return collect(client, TARGETS, at=AT, window_s=60, step_s=30, rate_window="2m", user_matchers="")


@pytest.fixture
def gc_restored() -> Any:
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


@pytest.mark.usefixtures("gc_restored")
@pytest.mark.parametrize("enabled", [True, False])
def test_collect_pauses_the_cyclic_gc_and_restores_it(enabled: bool) -> None:
    (gc.enable if enabled else gc.disable)()
    client = _Client()
    data = _collect(client)
    assert client.gc_seen and not any(client.gc_seen), "queries are fetched and decoded with the GC paused"
    assert gc.isenabled() is enabled
    assert data.values(TargetKey("j", "i"), next(iter(data.series[TargetKey("j", "i")]))) is not None


@pytest.mark.usefixtures("gc_restored")
def test_collect_restores_the_gc_when_a_query_fails() -> None:
    gc.enable()
    with pytest.raises(PrometheusBadResponse):
        _collect(_Client(fail=True))
    assert gc.isenabled()


@pytest.mark.usefixtures("gc_restored")
def test_nested_pauses_re_enable_only_what_they_disabled() -> None:
    gc.enable()
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled(), "the inner block found it off and leaves it off"
    assert gc.isenabled()


@pytest.mark.usefixtures("gc_restored")
@pytest.mark.parametrize("enabled", [True, False])
def test_a_service_cycle_runs_with_the_gc_paused(monkeypatch: pytest.MonkeyPatch, enabled: bool) -> None:
    """The incremental evaluator pauses the cyclic GC for the whole cycle (collection and
    diagnosis) and leaves it as it found it."""
    import kvwatch.service.incremental as incremental

    seen: list[bool] = []

    def counted(*args: Any, **kwargs: Any) -> str:
        seen.append(gc.isenabled())
        return "evaluation"

    monkeypatch.setattr(incremental, "counted", counted)
    (gc.enable if enabled else gc.disable)()
    assert incremental.IncrementalEvaluator()(None, None, None, AT) == "evaluation"  # type: ignore[arg-type]
    assert seen == [False]
    assert gc.isenabled() is enabled
