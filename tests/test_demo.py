"""``kvwatch demo``: runs with nothing installed, covers every mode, leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support.prom import require_binary

from kvwatch.core.models import FailureMode
from kvwatch.demo.promrun import TEMP_PREFIX

CMD = [sys.executable, "-c", "import sys; from kvwatch.cli import main; sys.exit(main())"]


def _leftovers(tmp: Path) -> set[str]:
    """Scratch dirs of the demo under ``tmp``: each test points its subprocess's TMPDIR at a
    private directory, because other runs of the suite on the machine create and remove
    ``kvwatch-demo-*`` in the shared /tmp at any moment."""
    return {p.name for p in tmp.glob(f"{TEMP_PREFIX}*")}


def _env(tmp: Path) -> dict[str, str]:
    """The environment with TMPDIR private to the test (``tempfile`` in the child honours it)."""
    return {**os.environ, "TMPDIR": str(tmp)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for practical purposes (reaped by init after its parent exits)
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[1][0] != "Z"


def _run_demo(backend: str, tmp: Path) -> dict:
    before = _leftovers(tmp)
    res = subprocess.run([*CMD, "demo", "--backend", backend, "--format", "json", "--seed", "1"],
                         capture_output=True, text=True, timeout=300, env=_env(tmp))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "simulating" in res.stderr  # progress goes to stderr, never into the JSON
    assert _leftovers(tmp) == before
    doc = json.loads(res.stdout)
    assert doc["demo"]["backend"] == backend
    return doc


@pytest.fixture(scope="module")
def demo_json(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _run_demo("inprocess", tmp_path_factory.mktemp("tmpdir"))


@pytest.fixture(scope="module")
def demo_prom_json(tmp_path_factory: pytest.TempPathFactory) -> dict:
    require_binary("prometheus")
    require_binary("promtool")
    return _run_demo("prometheus", tmp_path_factory.mktemp("tmpdir"))


@pytest.mark.slow
def test_inprocess_demo_follows_the_json_contract(demo_json: dict) -> None:
    _check_contract(demo_json)


@pytest.mark.slow
@pytest.mark.prometheus
def test_prometheus_demo_follows_the_json_contract(demo_prom_json: dict) -> None:
    _check_contract(demo_prom_json)
    assert demo_prom_json["queries"] > 0  # it really went through PromQL


def _check_contract(doc: dict) -> None:
    assert doc["evaluated_at"].endswith("Z")
    targets = doc["targets"]
    expected = doc["demo"]["expected"]
    assert len(targets) == len(expected) >= 13
    assert {f"{t['labels']['job']}/{t['labels']['instance']}" for t in targets} == set(expected)
    for t in targets:
        assert {"job", "instance"} <= set(t["labels"])
        assert t["state"] in {m.value for m in FailureMode}
        assert t["diagnoses"] and all(d["triage"] and d["summary"] for d in t["diagnoses"])
    assert {t["engine"] for t in targets} == {"vllm", "sglang", "trtllm"}
    assert len({t["dialect"] for t in targets}) >= 3


def _check_every_mode(doc: dict) -> None:
    """Every mode and idle sub-cause is among the scenarios AND diagnosed as such."""
    expected = set(doc["demo"]["expected"].values())
    modes = {FailureMode.FULL, FailureMode.OSCILLATING, FailureMode.FRAGMENTED,
             FailureMode.MISREAD, FailureMode.IDLE, FailureMode.HEALTHY}
    assert {e.split(" ")[0] for e in expected} >= {m.value for m in modes}
    causes = {"low_demand", "batch_limited", "stalled", "compute_bound"}
    assert {e[e.find("(") + 1:-1] for e in expected if "(" in e} == causes
    diagnosed = {t["state"] for t in doc["targets"]}
    got_causes = {d.get("cause") for t in doc["targets"] for d in t["diagnoses"] if t["state"] == "idle"}
    missing = {m.value for m in modes} - diagnosed
    assert not missing, f"demo output shows no target in {sorted(missing)}"
    assert causes <= got_causes, f"idle sub-causes not diagnosed: {sorted(causes - got_causes)}"
    # both misread shapes: the tail preset alone, and a replica group whose mean hides one replica
    groups = doc["demo"]["groups"]
    assert any(g["expected"] == "misread" for g in groups.values())
    by_key = {f"{t['labels']['job']}/{t['labels']['instance']}": t for t in doc["targets"]}
    for name, g in groups.items():
        named = {d["mode"] for m in g["members"] for d in by_key[m]["diagnoses"]}
        assert g["expected"] in named, f"group {name}: kvwatch names {sorted(named)}"


@pytest.mark.slow
def test_demo_covers_every_failure_mode(demo_json: dict) -> None:
    _check_every_mode(demo_json)


@pytest.mark.slow
@pytest.mark.prometheus
def test_prometheus_demo_covers_every_failure_mode(demo_prom_json: dict) -> None:
    _check_every_mode(demo_prom_json)


@pytest.mark.slow
@pytest.mark.prometheus
def test_backends_see_the_same_fleet(demo_json: dict, demo_prom_json: dict) -> None:
    """In-process evaluation mirrors PromQL: same targets, dialects, blind spots and verdicts."""
    def view(doc: dict) -> dict[str, tuple]:
        return {t["labels"]["instance"]: (t["dialect"], t["state"], tuple(t["missing_signals"]),
                                          tuple(d.get("cause") for d in t["diagnoses"]))
                for t in doc["targets"]}

    inproc, prom = view(demo_json), view(demo_prom_json)
    assert inproc == prom
    # and the facts the verdicts rest on agree (rates/quantiles computed the same way)
    facts = {t["labels"]["instance"]: t["facts"] for t in demo_prom_json["targets"]}
    for t in demo_json["targets"]:
        for name, v in t["facts"].items():
            w = facts[t["labels"]["instance"]].get(name)
            if isinstance(v, float) and isinstance(w, float):
                assert abs(v - w) <= 0.1 * max(abs(v), abs(w)) + 0.05, (t["labels"]["instance"], name, v, w)
            else:
                assert (v is None) == (w is None), (t["labels"]["instance"], name, v, w)


@pytest.mark.slow
def test_sigint_mid_run_exits_130_and_leaves_nothing(tmp_path: Path) -> None:
    before = _leftovers(tmp_path)
    proc = subprocess.Popen([*CMD, "demo", "--backend", "inprocess"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(tmp_path))
    try:
        deadline = time.monotonic() + 60
        line = ""
        while time.monotonic() < deadline and "simulating" not in line:
            line = proc.stderr.readline()  # type: ignore[union-attr]
        assert "simulating" in line
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _leftovers(tmp_path) == before


def _children(pid: int) -> dict[int, str]:
    """Live child processes of ``pid``: pid → command name."""
    out: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if int(rest[1]) == pid and rest[0] != "Z":
            out[int(stat.parent.name)] = comm
    return out


@pytest.mark.slow
@pytest.mark.prometheus
def test_prometheus_demo_interrupted_during_backfill_leaves_nothing(tmp_path: Path) -> None:
    """Ctrl-C while promtool runs: exit 130, promtool gone, temp dir gone (SIGTERM takes
    the same path: see the Scratch test below)."""
    require_binary("prometheus")
    require_binary("promtool")
    before = _leftovers(tmp_path)
    proc = subprocess.Popen([*CMD, "demo", "--backend", "prometheus"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=_env(tmp_path))
    kids: dict[int, str] = {}
    try:
        # a guard against a hang, not a speed check: simulating the 16 targets takes ~30 s quiet
        # and over 90 s on a loaded 2-core machine; the same 300 s as the other demo runs
        deadline = time.monotonic() + 300
        line = ""
        while time.monotonic() < deadline and "backfilling" not in line and proc.poll() is None:
            line = proc.stderr.readline()  # type: ignore[union-attr]
        assert "backfilling" in line
        while time.monotonic() < deadline and "promtool" not in kids.values():
            kids = _children(proc.pid)
            time.sleep(0.02)
        assert "promtool" in kids.values(), kids
        assert len(_leftovers(tmp_path) - before) == 1  # the scratch dir exists while it runs
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in kids if _alive(p)], f"children survived: {kids}"
    assert _leftovers(tmp_path) == before


def test_auto_backend_needs_both_binaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvwatch.demo import Backend, pick_backend

    monkeypatch.setenv("PATH", str(tmp_path))
    assert pick_backend(Backend.AUTO) is Backend.INPROCESS
    for name in ("prometheus", "promtool"):
        exe = tmp_path / name
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
        expected = Backend.PROMETHEUS if name == "promtool" else Backend.INPROCESS
        assert pick_backend(Backend.AUTO) is expected
    assert pick_backend(Backend.INPROCESS) is Backend.INPROCESS


@pytest.mark.prometheus
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_scratch_prometheus_is_gone_after_an_interrupt(tmp_path: Path, sig: signal.Signals) -> None:
    """A demo process holding a throwaway Prometheus is interrupted: no child, no temp dir remains."""
    require_binary("prometheus")
    before = _leftovers(tmp_path)
    script = textwrap.dedent("""
        import sys, time
        from kvwatch.demo import _sigterm_as_interrupt
        from kvwatch.demo.promrun import Scratch, find_binaries
        prom, _ = find_binaries()
        with _sigterm_as_interrupt(), Scratch() as s:
            url = s.prometheus(prom, s.dir / "data")
            print(s.pids[0], s.dir, url, flush=True)
            time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env=_env(tmp_path))
    try:
        pid_s, scratch_dir, _url = proc.stdout.readline().split()  # type: ignore[union-attr]
        pid = int(pid_s)
        assert _alive(pid) and Path(scratch_dir).is_dir()
        proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "prometheus child survived"
    assert not Path(scratch_dir).exists()
    assert _leftovers(tmp_path) == before


def test_backend_flag_is_validated() -> None:
    res = subprocess.run([*CMD, "demo", "--backend", "nope"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "invalid choice" in res.stderr


def test_sources_are_evaluated_on_what_the_engine_exposes() -> None:
    """Matchers select series (absent label == ""), counters are rated, histograms summed by le."""
    import numpy as np

    from kvwatch.core.dialects import Source, SourceKind
    from kvwatch.demo.promlite import Exposed, evaluate_source
    from kvwatch.sim.expose import Family, Sample

    t = np.arange(0.0, 600.0 + 1, 15.0)
    ok = Sample("req_total", (("finished_reason", "stop"),), 2.0 * t)  # 2/s
    cut = Sample("req_total", (("finished_reason", "length"),), 0.5 * t)  # 0.5/s
    # 1 obs/s, all in (0.1, 0.2]; two engines, the second with twice the rate
    hist = [Sample("lat_bucket", (("engine", e), ("le", le)), k * v * t)
            for e, k in (("0", 1.0), ("1", 2.0)) for le, v in (("0.1", 0.0), ("0.2", 1.0), ("+Inf", 1.0))]
    fams = [Family("req_total", "counter", "", [ok, cut]), Family("lat", "histogram", "", hist),
            Family("g", "gauge", "", [Sample("g", (("engine", "0"),), 3.0), Sample("g", (("engine", "1"),), 4.0)])]
    ex = Exposed(fams, t)

    def ev(src: Source) -> np.ndarray | None:
        return evaluate_source(src, ex, rate_window=120.0, latency_window=300.0)

    total = ev(Source(SourceKind.COUNTER, "req_total", agg="sum"))
    assert total is not None and np.allclose(total[t >= 120], 2.5) and np.isnan(total[0])
    assert ev(Source(SourceKind.COUNTER, "req_total", 'finished_reason="abort"')) is None
    only = ev(Source(SourceKind.COUNTER, "req_total", 'finished_reason=~"len.*"', agg="sum"))
    assert only is not None and np.allclose(only[-1], 0.5)
    assert ev(Source(SourceKind.GAUGE, "g", 'priority=""', agg="sum"))[-1] == 7.0  # type: ignore[index]
    assert ev(Source(SourceKind.GAUGE, "g", agg="max"))[-1] == 4.0  # type: ignore[index]
    p50 = ev(Source(SourceKind.HIST_QUANTILE, "lat", quantile=0.5, scale=1000.0))
    assert p50 is not None and np.isclose(p50[-1], 150.0) and np.isnan(p50[t < 300]).all()
    assert ev(Source(SourceKind.HIST_QUANTILE, "nope", quantile=0.5)) is None


@pytest.mark.slow
@pytest.mark.parametrize("seeds", [(0, 1, 2, 3), (4, 5, 6, 7), (91, 95)])
def test_every_scenario_holds_on_other_seeds(seeds: tuple[int, ...]) -> None:
    """Issue 11 (8): a verdict that flips with the draw of one scenario is a verdict on the draw.
    The default seed passing proves little: on seeds 0, 3, 5 and 7 (9 of 0-40) the replica
    group's saturated member lost its imbalance misread to a queue shrinking 6-14/min off
    ~2,900; on 91 and 95 the scenario drew its other replicas at the rule's own 0.7 / 0.4 borders.
    Every scenario and every group must read as built on each of these seeds."""
    from kvwatch.config import load_settings
    from kvwatch.core.rules import load_ruleset
    from kvwatch.demo import WARMUP_S, scenario_table
    from kvwatch.demo.inprocess import evaluate_inprocess

    settings, rules = load_settings(None, environ={}), load_ruleset()
    for seed in seeds:
        evaluation, fleet = evaluate_inprocess(settings, rules, seed, WARMUP_S, lambda _: None)
        table = scenario_table(evaluation, fleet.expected(), fleet.groups())
        assert len(evaluation.results) == len(fleet.expected()) >= 13
        assert "DIFFERS" not in table, f"seed {seed}:{table}"
