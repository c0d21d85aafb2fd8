"""``kvwatch run`` as a real process against a real Prometheus: endpoints, SIGHUP, SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from support.prom import kvwatch_port, prometheus, wait_http

pytestmark = [pytest.mark.prometheus, pytest.mark.slow, pytest.mark.live]


def metric(base: str, name: str, **labels: str) -> float | None:
    text = requests.get(f"{base}/metrics", timeout=5).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def test_run_serves_reloads_and_stops_cleanly(tmp_path: Path) -> None:
    with prometheus() as prom:
        cfg = tmp_path / "kvwatch.yaml"
        cfg.write_text(f"prometheus: {{url: '{prom}'}}\nevaluation: {{interval: 1s, window: 2m, step: 15s}}\n")
        log = (tmp_path / "kvwatch.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvwatch.cli", "run", "--config", str(cfg), "--state", str(tmp_path / "s.db"),
             "--listen", "127.0.0.1:0"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            base = f"http://127.0.0.1:{kvwatch_port(tmp_path / 'kvwatch.log', proc)}"
            wait_http(f"{base}/healthz", timeout=30, proc=proc)
            wait_http(f"{base}/readyz", timeout=30, proc=proc)
            assert (metric(base, "kvwatch_cycles_total", outcome="ok") or 0) >= 1
            cfg.write_text("evaluation: {window: nonsense}\n")
            proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not metric(base, "kvwatch_config_reload_errors_total"):
                time.sleep(0.2)
            assert metric(base, "kvwatch_config_reload_errors_total") == 1
            n = metric(base, "kvwatch_cycles_total", outcome="ok") or 0
            time.sleep(1.5)
            assert (metric(base, "kvwatch_cycles_total", outcome="ok") or 0) > n  # still running, old config
            t = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
            assert time.monotonic() - t < 6
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
        out = (tmp_path / "kvwatch.log").read_text()
        assert out.count("kvwatch cycle ok") >= 2
        assert "config reload rejected" in out and "stopped" in out
