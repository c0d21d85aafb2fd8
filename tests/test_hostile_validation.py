"""Issue 13 items 8-12: bad input is refused before any work, in one line naming what and where (exit 2).

Every case runs the real CLI in-process through ``main()``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kvwatch.alerting.lifecycle import _silence_matches
from kvwatch.cli import main
from kvwatch.config import load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in [k for k in os.environ if k.startswith(("KVWATCH_", "SLACK_"))]:
        monkeypatch.delenv(k)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = main(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def one_line(err: list[str], *fragments: str) -> None:
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    for f in fragments:
        assert f in err[0], (f, err[0])


# ---- item 8: evaluation.interval 0s, one validator for file, environment, flags -------------------
def test_interval_zero_rejected_in_file_environment_and_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "kvwatch.yaml"
    cfg.write_text("evaluation:\n  interval: 0s\n")
    code, err = run(capsys, "check", "--config", str(cfg))
    assert code == 2
    one_line(err, str(cfg), "evaluation.interval", "expected > 0")
    monkeypatch.setenv("KVWATCH_EVALUATION_INTERVAL", "0s")
    code, err = run(capsys, "check")
    assert code == 2
    one_line(err, "environment", "evaluation.interval")
    monkeypatch.delenv("KVWATCH_EVALUATION_INTERVAL")
    code, err = run(capsys, "run", "--once", "--interval", "0s", "--prometheus-url", "http://127.0.0.1:1")
    assert code == 2
    one_line(err, "--interval", "expected > 0")


# ---- item 9: window/step beyond Prometheus' 11,000 points --------------------------------------
def test_impossible_window_and_step_rejected_up_front(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "kvwatch.yaml"
    cfg.write_text("evaluation:\n  window: 3650d\n  step: 1s\n")
    code, err = run(capsys, "check", "--config", str(cfg))
    assert code == 2
    one_line(err, str(cfg), "evaluation.step", "11,000")
    code, err = run(capsys, "once", "--prometheus-url", "http://127.0.0.1:1", "--window", "7d", "--step", "10s")
    assert code == 2  # refused before any query (port 1 would be exit 3)
    one_line(err, "evaluation.step", "11,000")
    assert load_settings(None, environ={}, overrides={"evaluation": {"window": "3h", "step": "1s"}})  # 10,801 ok


# ---- item 10: non-UTF-8 config, simulator ports and output paths --------------------------------
def test_non_utf8_config_and_rules_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "latin1.yaml"
    cfg.write_bytes("slack:\n  channel: '#caf\xe9'\n".encode("latin-1"))
    code, err = run(capsys, "check", "--config", str(cfg))
    assert code == 2
    one_line(err, str(cfg), "not UTF-8")
    rules = tmp_path / "rules.yaml"
    rules.write_bytes(b"version: 1\nrules: []\n# \xff\xfe\n")
    code, err = run(capsys, "check", "--rules", str(rules))
    assert code == 2
    one_line(err, str(rules), "not UTF-8")


def test_yaml_values_python_cannot_build_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "kvwatch.yaml"
    cfg.write_text("lifecycle:\n  silences:\n    - matchers: {job: x}\n      until: 2026-13-45\n")
    code, err = run(capsys, "check", "--config", str(cfg))
    assert code == 2
    one_line(err, str(cfg))


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("case", ["port-range", "port-in-use", "bad-host", "out-unwritable", "out-is-file"])
def test_simulator_bad_ports_and_paths_exit_2(case: str, busy_port: int, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    argv = {
        "port-range": ["serve", "--port", "99999"],
        "port-in-use": ["serve", "--port", str(busy_port)],
        "bad-host": ["serve", "--host", "no-such-host.invalid", "--port", "0"],
        "out-unwritable": ["backfill", "--out", "/proc/kvwatch-nope", "--presets", "full", "--seeds", "1"],
        "out-is-file": ["backfill", "--out", str(Path(__file__)), "--presets", "full", "--seeds", "1"],
    }[case]
    code, err = run(capsys, "simulate", *argv)
    assert code == 2
    one_line(err, "--port" if "port" in case or "host" in case else "--out")


# ---- item 11: silences ---------------------------------------------------------------------------
@pytest.mark.parametrize(("silence", "fragment"), [
    ("{matchers: {job: vllm}, until: notadate}", "RFC 3339"),
    ("{matchers: {}}", "at least one label matcher"),
    ("{until: '2026-12-01T00:00:00Z'}", "required"),
])
def test_bad_silences_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], silence: str,
                                  fragment: str) -> None:
    cfg = tmp_path / "kvwatch.yaml"
    cfg.write_text(f"lifecycle:\n  silences:\n    - {silence}\n")
    code, err = run(capsys, "check", "--config", str(cfg))
    assert code == 2
    one_line(err, str(cfg), "lifecycle.silences.0", fragment)
    assert "datetime.datetime" not in err[0]


def test_unquoted_yaml_timestamps_are_accepted_and_apply(tmp_path: Path) -> None:
    cfg = tmp_path / "kvwatch.yaml"
    cfg.write_text("lifecycle:\n  silences:\n    - matchers: {job: a}\n      until: 2026-12-01T10:00:00Z\n"
                   "    - matchers: {job: b}\n      until: 2026-12-01\n")
    s = load_settings(cfg, environ={})
    a, b = s.lifecycle.silences
    before, after = 1_796_119_200 - 60, 1_796_119_200 + 60  # 2026-12-01T10:00:00Z ± 1 min
    assert _silence_matches(a, {"job": "a"}, before) and not _silence_matches(a, {"job": "a"}, after)
    assert _silence_matches(b, {"job": "b"}, 1_796_083_200 - 1) and not _silence_matches(b, {"job": "b"},
                                                                                          1_796_083_200 + 1)


# ---- item 12: selectors and servers that are not Prometheus -------------------------------------
@pytest.mark.parametrize(("selector", "fragment"), [
    ('{job="x"} or vector(1)', "after '}'"),
    ('{__name__="foo"}', "__name__"),
    ('{job="x"}[5m]', "after '}'"),
    ("sum(up)", "label matcher"),
])
def test_selectors_beyond_label_matchers_exit_2(selector: str, fragment: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "once", "--prometheus-url", "http://127.0.0.1:1", "--selector", selector)
    assert code == 2
    one_line(err, "--selector", fragment)


@contextmanager
def json_server(answer: Any) -> Iterator[str]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_POST(self) -> None:
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_json_server_that_is_not_prometheus_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with json_server({"name": "some other API", "version": 3}) as url:
        code, err = run(capsys, "once", "--prometheus-url", url)
    assert code == 3
    one_line(err, url, "not a Prometheus API answer")
    assert "no error text" not in err[0]
