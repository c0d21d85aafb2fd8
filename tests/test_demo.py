"""``kvwatch demo``: runs with nothing installed, covers every mode, leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from support.prom import require_binary

from kvwatch.demo.promrun import TEMP_PREFIX
from kvwatch.models import FailureMode

CMD = [sys.executable, "-c", "import sys; from kvwatch.cli import main; sys.exit(main())"]


def _leftovers() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for practical purposes (reaped by init after its parent exits)
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[1][0] != "Z"


@pytest.fixture(scope="module")
def demo_json() -> dict:
    before = _leftovers()
    res = subprocess.run([*CMD, "demo", "--backend", "inprocess", "--format", "json", "--seed", "1"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "simulating" in res.stderr  # progress goes to stderr, never into the JSON
    assert _leftovers() == before
    return json.loads(res.stdout)


@pytest.mark.slow
def test_inprocess_demo_follows_the_json_contract(demo_json: dict) -> None:
    assert demo_json["evaluated_at"].endswith("Z")
    targets = demo_json["targets"]
    expected = demo_json["demo"]["expected"]
    assert len(targets) == len(expected) >= 13
    for t in targets:
        assert {"job", "instance"} <= set(t["labels"])
        assert t["state"] in {m.value for m in FailureMode}
        assert t["diagnoses"] and all(d["triage"] and d["summary"] for d in t["diagnoses"])
    assert {t["engine"] for t in targets} == {"vllm", "sglang", "trtllm"}


@pytest.mark.slow
def test_demo_covers_every_failure_mode(demo_json: dict) -> None:
    """Every mode and idle sub-cause is among the scenarios AND diagnosed as such."""
    expected = set(demo_json["demo"]["expected"].values())
    modes = {FailureMode.FULL, FailureMode.OSCILLATING, FailureMode.FRAGMENTED,
             FailureMode.MISREAD, FailureMode.IDLE, FailureMode.HEALTHY}
    assert {e.split(" ")[0] for e in expected} >= {m.value for m in modes}
    causes = {"low_demand", "batch_limited", "stalled", "compute_bound"}
    assert {e[e.find("(") + 1:-1] for e in expected if "(" in e} == causes
    diagnosed = {t["state"] for t in demo_json["targets"]}
    got_causes = {d.get("cause") for t in demo_json["targets"] for d in t["diagnoses"] if t["state"] == "idle"}
    missing = {m.value for m in modes} - diagnosed
    assert not missing, f"demo output shows no target in {sorted(missing)}"
    assert causes <= got_causes, f"idle sub-causes not diagnosed: {sorted(causes - got_causes)}"


@pytest.mark.slow
def test_sigint_mid_run_exits_130_and_leaves_nothing() -> None:
    before = _leftovers()
    proc = subprocess.Popen([*CMD, "demo", "--backend", "inprocess"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
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
    assert _leftovers() == before


@pytest.mark.prometheus
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_scratch_prometheus_is_gone_after_an_interrupt(tmp_path: Path, sig: signal.Signals) -> None:
    """A demo process holding a throwaway Prometheus is interrupted: no child, no temp dir remains."""
    require_binary("prometheus")
    before = _leftovers()
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
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
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
    assert _leftovers() == before


def test_backend_flag_is_validated() -> None:
    res = subprocess.run([*CMD, "demo", "--backend", "nope"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "invalid choice" in res.stderr
