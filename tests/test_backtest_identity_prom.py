"""Backtest identity over a span where targets change (issue 17, item 5), against a real Prometheus.

History (promtool backfill, samples every 15 s, ``up`` for every scraped target):

* ``upg:8000`` healthy-busy throughout; vLLM upgraded at ``U``: before it the KV
  gauge is ``vllm:gpu_cache_usage_perc``, from it ``vllm:kv_cache_usage_perc``;
* ``old:8000`` full until ``GONE``, then no longer scraped (no samples, no ``up``):
  a rolled pod; ``new:8000`` (its replacement, new labels) healthy-busy from ``GONE``.

At every checked instant ``t`` the backtest's step ``t`` must equal ``kvwatch once --at t``
(state), at the last step also the identity (dialect, engine, labels, gone), and the
old pod's incident must resolve as ``gone`` like ``kvwatch run`` resolves it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from support.prom import backfill, prometheus

from kvwatch.cli import main
from kvwatch.config import load_settings
from kvwatch.core.promclient import PromClient
from kvwatch.core.rules import load_ruleset
from kvwatch.tools.backtest.replay import run_backtest
from kvwatch.tools.backtest.synth import SynthTarget, openmetrics

D0 = 1_779_000_000 - 1_779_000_000 % 3600
MIN = 60.0
U, GONE = D0 + 60 * MIN, D0 + 80 * MIN
T0, T1 = D0 + 30 * MIN, D0 + 105 * MIN
INTERVAL = 15.0
TARGETS = (
    SynthTarget("upg:8000", ((105 * MIN, "healthy-busy"),), seed=3),
    SynthTarget("old:8000", ((105 * MIN, "full"),), seed=4),
    SynthTarget("new:8000", ((105 * MIN, "healthy-busy"),), seed=5),
)
#: instants compared with `once --at`: before the upgrade, inside the lookback after it, after it,
#: the old pod inside the lookback after it left, stale (gone), and the last step
CHECKS = (D0 + 50 * MIN, U + 3 * MIN, U + 15 * MIN, GONE + 3 * MIN, GONE + 10 * MIN, T1)


def _keep(line: str) -> tuple[bool, str]:
    """Whether a synthetic sample line is scraped, and under which name (the upgrade rename)."""
    ts = float(line.rsplit(" ", 1)[1])
    if 'instance="old:8000"' in line and ts >= GONE:
        return False, line
    if 'instance="new:8000"' in line and ts < GONE:
        return False, line
    if 'instance="upg:8000"' in line and ts < U and line.startswith("vllm:kv_cache_usage_perc{"):
        return True, line.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", 1)
    return True, line


def _history() -> str:
    lines, renamed = [], []
    for line in openmetrics(TARGETS, D0, T1, INTERVAL):
        if line.startswith("#"):
            if line != "# EOF":
                lines.append(line)
            continue
        keep, out = _keep(line)
        if keep:
            (renamed if out != line else lines).append(out)
    up = ["# TYPE up gauge"]
    for t in TARGETS:
        ts = D0
        while ts <= T1:
            if _keep(f'x{{instance="{t.instance}"}} 1 {ts:.0f}')[0]:
                up.append(f'up{{job="vllm",instance="{t.instance}"}} 1 {ts:.0f}')
            ts += INTERVAL
    return "\n".join([*lines, "# TYPE vllm:gpu_cache_usage_perc gauge", *renamed, *up, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("btid")
    om = work / "identity.om"
    om.write_text(_history())
    backfill(om, work / "tsdb")
    with prometheus(tsdb=work / "tsdb") as url:
        yield url


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def _once(capsys: pytest.CaptureFixture[str], url: str, at: float) -> dict[str, dict]:
    assert main(["once", "--prometheus-url", url, "--at", _iso(at), "--format", "json"]) == 0
    return {t["labels"]["instance"]: t for t in json.loads(capsys.readouterr().out)["targets"]}


def test_every_step_sees_what_once_sees(prom_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    settings = load_settings(None, environ={}, overrides={"prometheus": {"url": prom_url}})
    res = run_backtest(PromClient(prom_url), settings, load_ruleset(), datetime.fromtimestamp(T0, UTC),
                       datetime.fromtimestamp(T1, UTC), 60.0)
    for at in CHECKS:
        once = _once(capsys, prom_url, at)
        got = {}
        for tl in res.timelines:
            if at in tl.times:
                got[tl.target.key.instance] = tl.states[tl.times.index(at)].value
        assert got == {k: v["state"] for k, v in once.items()}, _iso(at)
    # the upgraded engine is read through its old KV name before the upgrade: healthy, not blind
    upg = res.timeline("upg:8000")
    assert upg is not None and {s.value for s in upg.states} == {"healthy"}
    # the last step's identity is `once --at T1`'s: the rolled pod is stale and gone there
    assert main(["backtest", "--prometheus-url", prom_url, "--from", _iso(T0), "--to", _iso(T1),
                 "--step", "1m", "--format", "json"]) == 0
    bt = {t["labels"]["instance"]: t for t in json.loads(capsys.readouterr().out)["targets"]}
    once = _once(capsys, prom_url, T1)
    for inst, o in once.items():
        want = (o["labels"], o["engine"], o["dialect"], o.get("gone", False), o["state"])
        b = bt[inst]
        assert (b["labels"], b["engine"], b["dialect"], b.get("gone", False), b["last_state"]) == want, inst
    assert once["old:8000"]["gone"] is True and set(bt) == set(once)


class _LoggingClient(PromClient):
    """A real client that records every query it sends."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.sent: list[tuple[object, ...]] = []

    def instant(self, query: str, at: datetime) -> list:
        self.sent.append(("instant", query, at))
        return super().instant(query, at)

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list:
        self.sent.append(("range", query, start, end, step_s))
        return super().range(query, start, end, step_s)


def test_rolled_pod_resolves_as_gone(prom_url: str) -> None:
    settings = load_settings(None, environ={}, overrides={"prometheus": {"url": prom_url}})
    rules = load_ruleset()
    counts = []
    for step in (60.0, 300.0):
        client = _LoggingClient(prom_url)
        res = run_backtest(client, settings, rules, datetime.fromtimestamp(T0, UTC),
                           datetime.fromtimestamp(T1, UTC), step)
        counts.append(client.stats.queries)
        # the upgraded engine's second identity reuses the first layer's answers: nothing is asked twice
        assert len(client.sent) == len(set(client.sent)) == client.stats.queries
        old = res.timeline("old:8000")
        assert old is not None
        [inc] = [i for i in old.incidents if i.mode.value == "full"]
        assert inc.opened_at <= T0 + 5 * MIN
        # resolved as gone (not held open as blind): after the lookback lets it go stale and the hold-down
        assert inc.resolution == "gone", inc
        hold = settings.lifecycle.hold_down
        assert inc.resolved_at is not None and GONE < inc.resolved_at <= GONE + 5 * MIN + hold + step
    # the number of queries does not depend on the steps: discovery, stale and `up` as range queries,
    # then the collection (the second identity of the upgraded engine adds no query: its sources
    # are the other targets' sources, already fetched)
    assert counts[0] == counts[1], counts
