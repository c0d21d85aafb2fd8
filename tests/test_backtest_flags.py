"""Issue 17 items 17-18: backtest flags say what they mean; --html without matplotlib is one line."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.prom import free_port

from kvwatch.cli import main


def test_step_must_be_a_multiple_of_the_resolution_flag(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: the flags are checked first
    code = main(["backtest", "--prometheus-url", url, "--from", "2026-01-01T00:00:00Z", "--to",
                 "2026-01-01T01:00:00Z", "--step", "45s", "--resolution", "30s"])
    err = capsys.readouterr().err
    assert code == 2 and "--resolution" in err and "45s" in err and len(err.strip().splitlines()) == 1


def test_backtest_help_names_the_replay_step_and_the_resolution(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["backtest", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "evaluate every DUR" in out and "a multiple of --resolution" in out
    assert "resolution of the range queries (evaluation.step)" in out


def test_html_without_matplotlib_is_one_line_naming_the_extra() -> None:
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from kvwatch.cli import main\n"
            "sys.exit(main(['backtest', '--prometheus-url', 'http://127.0.0.1:9', '--from', '2026-01-01T00:00:00Z',"
            " '--to', '2026-01-01T01:00:00Z', '--html', 'r.html']))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().endswith("--html needs matplotlib: pip install 'kvwatch[charts]'")
    assert len(res.stderr.strip().splitlines()) == 1
