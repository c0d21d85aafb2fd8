"""Bad input through the real CLI (a subprocess): exit codes 2/3 and one-line messages naming where.

Prometheus failures use a tiny local HTTP server that answers 500, garbage, a
JSON error, or sleeps past ``prometheus.timeout``. A Slack token is in the
environment of every run and must never show up in the output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from support.prom import free_port

from kvwatch.cli import main

TOKEN = "xoxb-999-SECRET-do-not-print"
AT = "2026-11-29T10:00:00Z"


def kvwatch(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KVWATCH_", "SLACK_"))}
    base |= {"SLACK_BOT_TOKEN": TOKEN, "SLACK_CHANNEL": "#oncall", **(env or {})}
    res = subprocess.run([sys.executable, "-m", "kvwatch.cli", *args], capture_output=True, text=True,
                         timeout=timeout, env=base)
    assert TOKEN not in res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    return res


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """``kvwatch.cli.main`` in this process (same code path as the console script, ~1 s cheaper)."""

    def run(*args: str, env: dict[str, str] | None = None) -> Result:
        for k in list(os.environ):
            if k.startswith(("KVWATCH_", "SLACK_")):
                monkeypatch.delenv(k)
        for k, v in {"SLACK_BOT_TOKEN": TOKEN, "SLACK_CHANNEL": "#oncall", **(env or {})}.items():
            monkeypatch.setenv(k, v)
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse usage errors
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        assert TOKEN not in out + err
        return Result(code, out, err)

    return run


@dataclass
class Behaviour:
    status: int = 200
    body: bytes = b""
    delay_s: float = 0.0


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _answer(self) -> None:
        b = self.server.behaviour
        self.server.hits += 1
        if self.server.first_hit is None:
            self.server.first_hit = time.monotonic()
        deadline = time.monotonic() + b.delay_s
        while time.monotonic() < deadline and not self.server.closing.is_set():
            time.sleep(0.05)  # bounded: shutdown interrupts it
        try:
            self.send_response(b.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(b.body)))
            self.end_headers()
            self.wfile.write(b.body)
        except OSError:
            pass  # the client gave up (timeout test)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, behaviour: Behaviour) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.behaviour = behaviour
        self.hits = 0
        self.first_hit: float | None = None  # time.monotonic() of the first request
        self.closing = threading.Event()


@pytest.fixture
def fake_prom() -> Iterator[_Server]:
    srv = _Server(Behaviour())
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.closing.set()
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


def url_of(srv: _Server) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ---------------------------------------------------------------- Prometheus: exit 3


def test_unreachable_url_exits_3_naming_it() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    res = kvwatch("once", "--prometheus-url", url, "--at", AT)
    assert res.returncode == 3
    assert url in res.stderr and res.stderr.count("\n") == 1
    assert res.stdout == ""


@pytest.mark.parametrize(
    ("status", "body", "fragment"),
    [
        (500, b"internal server error", "HTTP 500"),
        (200, b"<html>not prometheus</html>", "non-JSON"),
        (422, b'{"status":"error","errorType":"execution","error":"query processing would load too many samples"}',
         "too many samples"),
        (200, b'{"status":"success","data":{}}', "no data.result"),
        (200, b"[1, 2, 3]", "not a JSON object"),
    ],
)
def test_prometheus_bad_answers_exit_3(
    cli: Callable[..., Result], fake_prom: _Server, status: int, body: bytes, fragment: str
) -> None:
    fake_prom.behaviour = Behaviour(status, body)
    res = cli("once", "--prometheus-url", url_of(fake_prom), "--at", AT, "--format", "json")
    assert res.returncode == 3, res.stderr
    assert url_of(fake_prom) in res.stderr and fragment in res.stderr
    assert res.stdout == ""


def test_prometheus_timeout_exits_3_in_bounded_time(fake_prom: _Server, tmp_path: Path) -> None:
    fake_prom.behaviour = Behaviour(200, b'{"status":"success","data":{"resultType":"vector","result":[]}}', 20.0)
    cfg = write(tmp_path, "kvwatch.yaml", "prometheus:\n  timeout: 1s\n  retries: 0\n")
    res = kvwatch("once", "--config", str(cfg), "--prometheus-url", url_of(fake_prom), "--at", AT)
    ended = time.monotonic()
    assert res.returncode == 3, res.stderr
    assert url_of(fake_prom) in res.stderr and "1s" in res.stderr
    # Cut short by the 1 s timeout (no retry of a read timeout), far before the server's 20 s.
    # Timed from the first request the server saw, not from the subprocess start: interpreter
    # start and imports take 10 s and more on a loaded 2-core machine and say nothing about the
    # timeout. Bound: the 1 s timeout + 5 s for reporting and exit under load, < the 20 s delay.
    assert fake_prom.first_hit is not None
    assert ended - fake_prom.first_hit < 1.0 + 5.0


def test_timeout_from_environment(cli: Callable[..., Result], fake_prom: _Server) -> None:
    fake_prom.behaviour = Behaviour(200, b"{}", 5.0)
    res = cli("once", "--prometheus-url", url_of(fake_prom), "--at", AT,
                  env={"KVWATCH_PROMETHEUS_TIMEOUT": "500ms", "KVWATCH_PROMETHEUS_RETRIES": "0"})
    assert res.returncode == 3 and url_of(fake_prom) in res.stderr


# ------------------------------------------------------------- config and rules: exit 2


@pytest.mark.parametrize(
    ("yaml_text", "fragments"),
    [
        ("prometheus:\n  url: http://x\n  timeout: [1s\n", ["invalid YAML", "line "]),
        ("evaluation:\n  windoww: 5m\n", ["evaluation.windoww", "unknown key"]),
        ("prometheus:\n  retries: many\n", ["prometheus.retries", "'many'"]),
        ("evaluation:\n  window: 5 minutes\n", ["evaluation.window", "duration"]),
        (f"slack:\n  bot_token: [{TOKEN}]\n", ["slack.bot_token", "<secret>"]),
    ],
)
@pytest.mark.parametrize("command", ["check", "once"])
def test_bad_config_exits_2_naming_file_and_key(
    cli: Callable[..., Result], tmp_path: Path, command: str, yaml_text: str, fragments: list[str]
) -> None:
    cfg = write(tmp_path, "kvwatch.yaml", yaml_text)
    extra = ["--prometheus-url", f"http://127.0.0.1:{free_port()}", "--at", AT] if command == "once" else []
    env = {"SLACK_BOT_TOKEN": ""} if "bot_token" in yaml_text else None  # let the file's bad value count
    res = cli(command, "--config", str(cfg), *extra, env=env)
    assert res.returncode == 2, res.stderr
    line = next(ln for ln in res.stderr.splitlines() if str(cfg) in ln)
    for frag in fragments:
        assert frag in line, line


def test_invalid_yaml_through_the_console_script(tmp_path: Path) -> None:
    cfg = write(tmp_path, "kvwatch.yaml", "evaluation:\n  window: 30m\n  step: [30s\n")
    res = kvwatch("check", "--config", str(cfg))
    assert res.returncode == 2
    assert res.stderr.startswith(f"kvwatch: {cfg}: line ") and "invalid YAML" in res.stderr


RULE = """\
version: 1
rules:
  - id: my-typo-rule
    mode: full
    summary: s
    triage: [t]
    when:
      all:
        - {signal: kv_usagee, stat: mean, op: ">=", value: 0.9}
"""


@pytest.mark.parametrize("command", ["check", "once"])
def test_rule_with_unknown_signal_exits_2_naming_file_rule_and_key(tmp_path: Path, command: str) -> None:
    rules = write(tmp_path, "rules.yaml", RULE)
    cfg = write(tmp_path, "kvwatch.yaml", "evaluation:\n  window: 30m\n")
    extra = ["--prometheus-url", f"http://127.0.0.1:{free_port()}", "--at", AT] if command == "once" else []
    res = kvwatch(command, "--config", str(cfg), "--rules", str(rules), *extra)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"kvwatch: {rules}: rules[0] (my-typo-rule): when.all.0.signal: unknown signal 'kv_usagee' "
        + res.stderr.split("unknown signal 'kv_usagee' ", 1)[1].strip()
    ]
    assert "expected one of" in res.stderr and "kv_usage," in res.stderr


def test_check_accepts_bundled_rules_and_a_good_config(tmp_path: Path) -> None:
    cfg = write(tmp_path, "kvwatch.yaml", "evaluation:\n  window: 20m\nslack:\n  channel: '#x'\n")
    res = kvwatch("check", "--config", str(cfg))
    assert res.returncode == 0, res.stderr
    assert "config ok" in res.stdout and "rules" in res.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--selector", '{namespace="llm"'], "--selector"),
        (["--selector", "{namespace=llm}"], "--selector"),
        (["--window", "5 minutes"], "--window"),
        (["--at", "yesterday"], "--at"),
        (["--format", "yaml"], "--format"),
    ],
)
def test_bad_flags_exit_2(cli: Callable[..., Result], args: list[str], fragment: str) -> None:
    res = cli("once", "--prometheus-url", f"http://127.0.0.1:{free_port()}", *args)
    assert res.returncode == 2, res.stderr
    assert fragment in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_once_notify_about_the_past_needs_an_explicit_state_file(
    cli: Callable[..., Result], fake_prom: _Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17 item 14: `once --at <past> --notify` wrote into the live state file and paged about
    the past. Without --state / KVWATCH_STATE_PATH it is refused (exit 2, one line, no query)."""
    monkeypatch.chdir(tmp_path)  # the default state.path is relative: it must not appear here
    res = cli("once", "--prometheus-url", url_of(fake_prom), "--at", "2026-01-01T00:00:00Z", "--notify")
    assert res.returncode == 2 and "--state" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert fake_prom.hits == 0 and list(tmp_path.iterdir()) == []
