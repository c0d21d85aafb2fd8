"""Fixtures written by the engines' own exporter code (conformance/) read by kvwatch.

``conformance/regenerate`` replayed simulator timelines through vLLM's and SGLang's real
Prometheus code; the expositions are committed under tests/fixtures/conformance/. Here,
with no engine installed, a real Prometheus holds them and kvwatch must:

- recognise each fixture's engine and dialect from the names alone and resolve its signals;
- give the same state through the real exporter's series as through the simulator's
  hand-written exposition of the same timeline (same preset, seed and instants);
- read the same waiting/running counts when every SGLang TP rank exports as with one rank;
- be read with the dialect table the fixtures were made against (else: regenerate).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.cache import generated
from support.prom import backfill, prometheus

from conformance import fixtures as fx
from conformance import om
from kvwatch.config import load_settings
from kvwatch.core.collect import resolve
from kvwatch.core.dialects.table import DIALECT_BY_ID
from kvwatch.core.models import Target
from kvwatch.core.pipeline import evaluate
from kvwatch.core.promclient import PromClient
from kvwatch.core.rules import load_ruleset
from kvwatch.core.signals import ONLY_WITHOUT, Signal
from kvwatch.sim.fleet import make_targets, simulate
from kvwatch.sim.openmetrics import write_openmetrics

pytestmark = pytest.mark.prometheus

#: signals every real exposition of these engines must resolve
CORE = {Signal.KV_USAGE, Signal.RUNNING, Signal.WAITING, Signal.PREEMPTIONS, Signal.TTFT_P99,
        Signal.TTFT_MEAN, Signal.QUEUE_MEAN, Signal.ITL_P99, Signal.GEN_TPS,
        Signal.PROMPT_TPS, Signal.REQUEST_RATE}
SIM_JOB = "conformance-sim"
#: what a release really lacks: SGLang 0.4.x declares sglang:avg_request_queue_latency but
#: its log_stats never sets it, and has no queue-time or per-request TPOT histogram (its
#: hand-written twin is the 0.5 set, which has both)
LACKS: dict[tuple[str, str], set[Signal]] = {
    ("sglang", "0.4."): {Signal.QUEUE_MEAN, Signal.QUEUE_P99, Signal.TPOT_P99}}


def lacks(head: dict[str, str]) -> set[Signal]:
    """What the release a fixture header names really lacks (:data:`LACKS`)."""
    return set().union(*(v for (e, pre), v in LACKS.items()
                         if head["engine"] == e and head["version"].startswith(pre)))


def _series() -> dict[str, tuple[dict[str, str], Path]]:
    out = {}
    for path in fx.fixtures():
        if path.name.endswith(".prom"):
            continue
        head = fx.header(path)
        out[head["instance"]] = (head, path)
    return out


def _snapshots() -> dict[str, tuple[dict[str, str], Path]]:
    out = {}
    for path in fx.fixtures():
        if path.name.endswith(".prom"):
            head = fx.header(path)
            out[path.name.removesuffix(".prom")] = (head, path)
    return out


def _hand_written(series: dict[str, tuple[dict[str, str], Path]], work: Path
                  ) -> dict[str, str]:
    """Simulate each distinct timeline once; fixture instance → hand-written instance."""
    runs, pairs = {}, {}
    for inst, (h, _) in series.items():
        key = (h["sim_preset"], h["sim_dialect"], int(h["seed"]), int(h["data_parallel"]))
        if key not in runs:
            (spec, *_) = make_targets(key[0], key[1], key[2],
                                      run_s=300.0 + float(h["duration_s"]),
                                      data_parallel=key[3])
            spec = replace(spec, name=f"{spec.name}-dp{key[3]}")  # one instance per timeline
            runs[key] = simulate(spec, duration_s=float(h["duration_s"]),
                                 end_time=float(h["end_time"]),
                                 scrape_interval_s=float(h["interval_s"]))
        pairs[inst] = runs[key].spec.instance()
    write_openmetrics(list(runs.values()), work / "sim.om", job=SIM_JOB)
    return pairs


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    series, snaps = _series(), _snapshots()
    assert series, f"no conformance fixtures in {fx.FIXTURES}; run conformance/regenerate"
    work = tmp_path_factory.mktemp("conformance")
    end = max(float(h["end_time"]) for h, _ in series.values())

    def make(out: Path) -> None:  # blocks of the committed fixtures and their simulated twins
        tsdb = out / "tsdb"
        for inst, (_, path) in series.items():
            (out / f"{inst}.om").write_text(fx.openmetrics_body(path), encoding="utf-8")
            backfill(out / f"{inst}.om", tsdb)
        (out / "pairs.json").write_text(json.dumps(_hand_written(series, out)))
        backfill(out / "sim.om", tsdb)
        # snapshots: the same body as four scrapes, 15 s apart, ending at the series' end
        snap_scrapes = {(("instance", name), ("job", "conformance-snapshot")):
                        [om.Scrape(end - 45 + 15 * i, fx.split(p)[1]) for i in range(4)]
                        for name, (_, p) in snaps.items()}
        if snap_scrapes:
            om.write(snap_scrapes, out / "snap.om")
            backfill(out / "snap.om", tsdb)
        for f in out.glob("*.om"):
            f.unlink()

    # cached by the fixture files' content and the code that turns them into blocks (tests/support/cache.py)
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in fx.fixtures()}
    data = generated("conformance-world", {"fixtures": files, "job": SIM_JOB},
                     ("conformance.fixtures", "conformance.om", "kvwatch.sim.fleet", "kvwatch.sim.openmetrics"),
                     make, work)
    pairs = json.loads((data / "pairs.json").read_text())
    tsdb = shutil.copytree(data / "tsdb", work / "tsdb")  # Prometheus writes to its TSDB; the cache stays as made
    at = datetime.fromtimestamp(end, tz=UTC)
    with prometheus(tsdb) as url:
        client = PromClient(url, timeout_s=60)
        settings = load_settings(None, environ={}, overrides={"prometheus": {"url": url}})
        ev = evaluate(client, settings, load_ruleset(), at)
        results = {r.target.key.instance: r for r in ev.results}
        yield {"series": series, "snaps": snaps, "pairs": pairs, "results": results,
               "client": client, "at": at}


def test_fixtures_cover_the_acceptance_set() -> None:
    """vLLM 0.33, an older vLLM and SGLang 0.5.x, each as a snapshot and healthy/full series."""
    have = {(h["engine"], h["version"], h["variant"], h["scenario"])
            for h, _ in [*_series().values(), *_snapshots().values()]}
    versions = {(e, v) for e, v, _, _ in have}
    assert ("vllm", "0.33.0") in versions
    assert any(e == "vllm" and v != "0.33.0" for e, v in versions), versions
    assert any(e == "sglang" and v.startswith("0.5.") for e, v in versions), versions
    for engine, version in versions:
        for scenario in ("healthy", "full", "full-last-scrape"):
            assert (engine, version, "default", scenario) in have, (engine, version, scenario)


def test_every_fixture_is_recognised_from_names_alone(world) -> None:
    results = world["results"]
    named = {**{i: h for i, (h, _) in world["series"].items()},
             **{n: h for n, (h, _) in world["snaps"].items()}}
    for inst, head in named.items():
        r = results.get(inst)
        assert r is not None, f"{inst}: not discovered"
        t = r.target
        assert t.engine == head["engine"], (inst, t.engine)
        assert t.dialect in head["dialects"].split(","), (inst, t.dialect)
        missing = CORE - lacks(head) - set(resolve(t))
        assert not missing, f"{inst}: unresolved {sorted(s.value for s in missing)}"


def test_real_and_hand_written_expositions_give_the_same_state(world) -> None:
    results, rows, wrong = world["results"], [], []
    for inst, (head, _) in sorted(world["series"].items()):
        real = results[inst]
        sim = results[world["pairs"][inst]]
        rows.append(f"{head['engine']} {head['version']} {head['variant']:8s} "
                    f"{head['scenario']:8s} real={real.state.value:10s} "
                    f"hand-written={sim.state.value}")
        if real.state != sim.state:
            wrong.append(inst)
    print("\n" + "\n".join(rows))
    assert not wrong, "\n".join(rows)


def _signal_value(world, inst: str, signal: Signal, rate_window: str = "2m") -> float:
    target = world["results"][inst].target
    src = resolve(target)[signal]
    q = src.promql(f'instance="{inst}"', rate_window)
    rows = world["client"].instant(q, world["at"])
    assert len(rows) == 1, (inst, signal, q, rows)
    return float(rows[0]["value"][1])


def test_sglang_all_tp_ranks_read_like_one_rank(world) -> None:
    """enable_metrics_for_all_schedulers: every rank exports the same batch (issue 14, 6)."""
    tp = {i: h for i, (h, _) in world["series"].items()
          if h["engine"] == "sglang" and h["variant"] == "tp2"}
    assert tp, "no SGLang tp2 fixture"
    for inst in tp:
        one = inst.replace("-tp2-", "-")
        for signal in (Signal.RUNNING, Signal.WAITING, Signal.GEN_TPS):
            many, single = _signal_value(world, inst, signal), _signal_value(world, one, signal)
            assert many == single, f"{inst} {signal.value}: {many} with 2 ranks, {single} with 1"


def test_sglang_05_tokens_are_read_as_its_scheduler_decodes_them(world) -> None:
    """SGLang 0.5.23 counts decoded tokens at every scheduler iteration
    (``realtime_tokens_total{mode="decode"}``) as well as per finished request
    (``generation_tokens_total``): kvwatch reads the live count, so a zero rate means nothing
    was decoded (tokens_at_finish 0) and equals the tokens the simulator generated."""
    checked = 0
    for inst, (head, _) in world["series"].items():
        if head["engine"] != "sglang" or not head["version"].startswith("0.5."):
            continue
        src = resolve(world["results"][inst].target)[Signal.GEN_TPS]
        assert src.metric == "sglang:realtime_tokens_total" and not src.counted_at_finish, (inst, src.metric)
        # over 10 minutes: the twin's scrapes need not align with the fixture's within a 2 m window
        real = _signal_value(world, inst, Signal.GEN_TPS, "10m")
        twin = _signal_value(world, world["pairs"][inst], Signal.GEN_TPS, "10m")
        assert real == pytest.approx(twin, rel=0.02), (inst, real, twin)
        checked += 1
    assert checked, "no SGLang 0.5 fixture"


def _without(target: Target, signal: Signal) -> Target:
    """``target`` as an engine that exports none of its dialect's sources of ``signal`` would be."""
    d = DIALECT_BY_ID[target.dialect]
    names = {n for src in d.sources.get(signal, ()) for n in src.requires}
    return replace(target, names=target.names - names)


@pytest.mark.parametrize("stand_in", sorted(ONLY_WITHOUT, key=lambda s: s.value))
def test_stand_ins_read_through_the_real_exporters_where_what_they_stand_in_for_is_missing(world, stand_in) -> None:
    """A stand-in signal (ONLY_WITHOUT) is read only where its preferred signal is not exported:
    the mean inter-token latency (a step, for the requests finishing per step) without token
    counters, the request time per token (a slow engine against an idle one) without TTFT.
    Through the engines' own exporters (vLLM, SGLang) it must resolve once the preferred
    families are gone and read what the simulator ran, as its hand-written twin does."""
    preferred = ONLY_WITHOUT[stand_in]
    checked = 0
    for inst, (head, _) in world["series"].items():
        if head["engine"] not in ("vllm", "sglang"):
            continue
        target = world["results"][inst].target
        assert stand_in not in resolve(target), inst  # the preferred signal is exported
        twin = world["results"][world["pairs"][inst]].target
        values = []
        for name, t in ((inst, target), (world["pairs"][inst], twin)):
            src = resolve(_without(t, preferred)).get(stand_in)
            assert src is not None, f"{name}: no {stand_in.value} once {preferred.value} is gone"
            rows = world["client"].instant(src.promql(f'instance="{name}"', "10m", "10m"), world["at"])
            assert len(rows) == 1, (name, src.metric, rows)
            values.append(float(rows[0]["value"][1]))
        real, sim = values
        # over 10 minutes, as the rules read them; the scrapes of the two need not align (measured:
        # itl_mean within 0.6 %, 2.4 % on vLLM 0.8.5's healthy run; request_time_per_token within
        # 2.1 %, 3.2 % on that run)
        assert 0 < real < 10 and real == pytest.approx(sim, rel=0.05), (inst, stand_in.value, real, sim)
        checked += 1
    assert checked, "no vLLM or SGLang fixture"


def test_fixtures_are_newer_than_the_dialect_table_that_reads_them() -> None:
    stale = []
    for path in fx.fixtures():
        head = fx.header(path)
        now = fx.dialect_fingerprint(head["dialects"].split(","))
        if head["dialect_fingerprint"] != now:
            stale.append(f"{path.name} (made against {head['dialect_fingerprint']}, now {now})")
    assert not stale, ("the dialect table changed after these fixtures were made; run "
                       "conformance/regenerate (see conformance/README.md): " + ", ".join(stale))


def test_hand_written_expositions_export_what_the_real_exporter_exports(world) -> None:
    """The simulator's hand-written /metrics must carry every signal the engine's own exporter
    code carries for the same timeline: a signal the simulator leaves out (vLLM 0.33's and
    SGLang 0.5's per-request time per output token, once) makes every corpus drawn with it blind
    where the real engine is not, and the rules that read it go untested on that engine."""
    results, wrong = world["results"], []
    for inst, (head, _) in sorted(world["series"].items()):
        real = set(resolve(results[inst].target))
        sim = set(resolve(results[world["pairs"][inst]].target))
        sim -= lacks(head)
        if real != sim:
            wrong.append(f"{head['engine']} {head['version']} {head['variant']} {head['scenario']}: "
                         f"real only {sorted(s.value for s in real - sim)}, "
                         f"hand-written only {sorted(s.value for s in sim - real)}")
    assert not wrong, "\n".join(wrong)
