"""kvwatch's native Prometheus rules: promtool check/test, annotations, coverage of the dialect table."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.prom import PROMTOOL, require_binary

from kvwatch.core.dialects import DIALECTS
from kvwatch.core.signals import Signal
from kvwatch.tools.dashboards.queries import numeric_sources
from kvwatch.tools.dashboards.recording import INFO_RECORD, RECORDS

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "rules" / "prometheus"
RULE_FILES = sorted(RULES.glob("*.yaml"))
TEST_FILES = sorted((RULES / "tests").glob("*.test.yaml"))
ALERTS = RULES / "kvwatch-alerts.yaml"
RECORDING = RULES / "kvwatch-recording.yaml"


def _rules(path: Path) -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = require_binary(PROMTOOL)
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.mark.prometheus
def test_promtool_check_rules() -> None:
    assert RULE_FILES and ALERTS in RULE_FILES and RECORDING in RULE_FILES
    res = _promtool("check", "rules", *map(str, RULE_FILES))
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.prometheus
@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_test_rules(test_file: Path) -> None:
    res = _promtool("test", "rules", str(test_file))
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.prometheus
def test_promtool_test_fails_when_a_rule_breaks(tmp_path: Path) -> None:
    """The unit tests are not vacuous: loosening one threshold makes them fail."""
    original = ALERTS.read_text()
    broken = original.replace(">= 5 * instance:kvwatch_ttft_seconds:p50_rate2m", ">= 0")
    for clause in ("running_requests:sum < 0.5", "generation_tokens:rate2m < 0.5"):
        broken = broken.replace(f"and on (job, instance) instance:kvwatch_{clause}", "")
    assert "sum < 0.5" not in broken and "rate2m < 0.5" not in broken and ">= 0\n" in broken
    (tmp_path / "kvwatch-alerts.yaml").write_text(broken)
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "t.test.yaml").write_text((RULES / "tests" / "kvwatch-alerts.test.yaml").read_text())
    res = _promtool("test", "rules", str(tests / "t.test.yaml"))
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert "KVWatchSchedulerStalled" in out and "KVWatchTTFTTailMisread" in out


def test_alerts_carry_runbook_summary_description() -> None:
    doc = (ROOT / "docs" / "dashboards.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", doc, re.M)}
    alerts = [r for r in _rules(ALERTS) if "alert" in r]
    assert len(alerts) >= 5
    for r in alerts:
        ann = r["annotations"]
        assert {"runbook_url", "summary", "description"} <= ann.keys(), r["alert"]
        assert "severity" in r["labels"], r["alert"]
        anchor = ann["runbook_url"].rsplit("#", 1)[1]
        assert anchor in anchors, f"{r['alert']}: runbook anchor #{anchor} missing in docs/dashboards.md"


def test_every_alert_has_firing_and_non_firing_cases() -> None:
    alerts = {r["alert"] for r in _rules(ALERTS) if "alert" in r}
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in TEST_FILES:
        for group in yaml.safe_load(path.read_text())["tests"]:
            inputs = {m.group(1) for s in group["input_series"] for m in [re.search(r'instance="([^"]+)"', s["series"])] if m}
            for case in group.get("alert_rule_test", []):
                fired = {a["exp_labels"]["instance"] for a in case.get("exp_alerts", [])}
                if fired:
                    firing.add(case["alertname"])
                if not fired or inputs - fired:
                    quiet.add(case["alertname"])  # explicitly empty, or an input instance that must not fire
    assert alerts <= firing, f"no firing case: {sorted(alerts - firing)}"
    assert alerts <= quiet, f"no non-firing case: {sorted(alerts - quiet)}"


def test_recording_rules_cover_every_signal_and_dialect() -> None:
    assert set(RECORDS) == set(Signal)
    rules = [r for r in _rules(RECORDING) if "record" in r]
    by_key = {(r["record"], r["labels"]["engine"]): r["expr"] for r in rules}
    names = [r["record"] for r in rules]
    assert all(re.fullmatch(r"instance:kvwatch_[a-z_]+:[a-z0-9_]+", n) for n in names)
    for d in DIALECTS:
        for sig in Signal:
            for src in numeric_sources(d, sig):
                expr = by_key[(RECORDS[sig], d.engine)]
                assert src.promql("", "2m") in expr, (d.id, sig, src.metric)
        assert (INFO_RECORD, d.engine) in by_key


def test_the_alerts_read_finishes_per_step_on_exactly_the_engines_the_dialect_table_reads_so() -> None:
    """The native alerts name the engines whose running gauge is read after the step's finished
    requests left (λ, the dips a cap shows) in one matcher per way of reading λ (token counters, else
    the inter-token latency); it must be the dialect table's set (``Source.after_finishes``), or a
    cap on an engine added to the table reads `fragmented` there."""
    (rule,) = [r for r in _rules(ALERTS) if r.get("record") == "instance:kvwatch_finishes_per_step:ratio10m"]
    matchers = re.findall(r'engine=~"([^"]+)"', rule["expr"])
    assert len(matchers) == 2 and len(set(matchers)) == 1, matchers
    after = {d.engine for d in DIALECTS for s in d.sources.get(Signal.RUNNING, ()) if s.after_finishes}
    assert set(matchers[0].split("|")) == after
    # the pinned clause inherits the engines from the λ series instead of naming them again
    (pinned,) = [r for r in _rules(ALERTS) if r.get("record") == "instance:kvwatch_running_pinned:10m"]
    assert "engine" not in pinned["expr"]
