"""``kvwatch simulate`` sub-commands, through the add_parser contract of the main CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from support.prom import require_binary

from kvwatch.sim import cli
from kvwatch.sim.vocab import Dialect


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvwatch")
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "list"]) == 0
    assert "misread-imbalance" in capsys.readouterr().out
    assert main(["simulate", "list", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["presets"]) == 13 and len(doc["dialects"]) == len(Dialect)
    assert main(["simulate"]) == 2  # no sub-command: help, usage error


@pytest.mark.parametrize("argv", [
    ["--presets", "nope"], ["--dialects", "vllm-9"], ["--duration", "40x"],
    ["--end", "yesterday"], ["--end", "2026-01-01T00:00:00"],
])
def test_backfill_bad_usage(argv: list[str], tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "backfill", "--out", str(tmp_path), *argv]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_durations_and_times() -> None:
    assert cli.parse_duration("40m") == 2400 and cli.parse_duration("1h30m") == 5400
    assert cli.parse_duration("90") == 90
    assert cli.parse_time("2026-11-29T10:00:00Z") == 1795946400.0


@pytest.mark.prometheus
def test_backfill_writes_corpus_and_tsdb(tmp_path: Path) -> None:
    require_binary("promtool")
    out, tsdb = tmp_path / "corpus", tmp_path / "tsdb"
    code = main(["simulate", "backfill", "--out", str(out), "--presets", "full,idle-low-demand",
                 "--dialects", "sglang-0.5", "--seeds", "1", "--duration", "35m",
                 "--end", "2026-11-29T09:00:00Z", "--tsdb", str(tsdb)])
    assert code == 0
    doc = json.loads((out / "manifest.json").read_text())
    assert [t["expected"] for t in doc["targets"]] == ["full", "idle"]
    assert doc["end"] == "2026-11-29T09:00:00Z"
    assert (out / "fleet.om").read_text().endswith("# EOF\n")
    assert list(tsdb.glob("*/meta.json"))
