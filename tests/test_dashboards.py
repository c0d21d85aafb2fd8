"""Structure, determinism and lints of the generated Grafana dashboards."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvwatch.core.dialects import DIALECTS
from kvwatch.core.signals import Signal
from kvwatch.tools.dashboards.build import DASHBOARDS, render_all, stale_files, write_all
from kvwatch.tools.dashboards.grafana import DATASOURCE, SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[1]
UIDS = {"kvwatch-fleet", "kvwatch-instance", "kvwatch-self"}


def _load(rel: str) -> dict[str, Any]:
    return json.loads((ROOT / rel).read_text(encoding="utf-8"))


DASHES = {rel: _load(rel) for rel in DASHBOARDS}


def _panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in d["panels"] if p["type"] != "row"]


def _exprs(d: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in _panels(d) for t in p.get("targets", [])]


def test_checked_in_files_match_the_generator() -> None:
    assert stale_files(ROOT) == [], "generated files are stale: run `python -m kvwatch.tools.dashboards`"


def test_regeneration_is_byte_identical(tmp_path: Path) -> None:
    first = render_all()
    assert write_all(tmp_path) and write_all(tmp_path) == []
    assert render_all() == first
    for rel, text in first.items():
        assert (tmp_path / rel).read_text(encoding="utf-8") == text


def test_cli_check_reports_stale_file(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "kvwatch.tools.dashboards", "--root", str(tmp_path)]
    assert subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
    assert subprocess.run([*cmd, "--check"], capture_output=True, timeout=60).returncode == 0
    (tmp_path / "dashboards/kvwatch-fleet.json").write_text("{}")
    res = subprocess.run([*cmd, "--check"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "dashboards/kvwatch-fleet.json" in res.stderr


@pytest.mark.parametrize("rel", sorted(DASHES))
def test_importer_structure(rel: str) -> None:
    d = DASHES[rel]
    assert d["uid"] in UIDS and d["title"] and d["schemaVersion"] >= SCHEMA_VERSION >= 39
    (inp,) = d["__inputs"]
    assert inp == {**inp, "name": "DS_PROMETHEUS", "type": "datasource", "pluginId": "prometheus"}
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in d["panels"]:
        assert {"id", "type", "title", "gridPos"} <= p.keys(), p.get("title")
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24 and g["h"] > 0
        if p["type"] in ("row", "text"):
            continue
        assert p["targets"], p["title"]
        assert all(t["expr"] and t["refId"] for t in p["targets"]), p["title"]
        assert len(p["description"]) > 60, f"{p['title']}: say how to read the panel"


def test_template_variables() -> None:
    for rel in ("dashboards/kvwatch-fleet.json", "dashboards/kvwatch-instance.json"):
        names = [v["name"] for v in DASHES[rel]["templating"]["list"]]
        assert names == ["datasource", "job", "namespace", "model", "engine", "instance"]
    inst = {v["name"]: v for v in DASHES["dashboards/kvwatch-instance.json"]["templating"]["list"]}["instance"]
    assert inst["multi"] is False and inst["includeAll"] is False  # Slack links pass exactly one instance


def _datasources(node: Any, path: str = "") -> list[tuple[str, Any]]:
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "datasource":
                out.append((path, v))
            else:
                out += _datasources(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _datasources(v, f"{path}/{i}")
    return out


@pytest.mark.parametrize("rel", sorted(DASHES))
def test_every_datasource_reference_uses_the_variable(rel: str) -> None:
    refs = _datasources(DASHES[rel])
    assert refs
    assert all(ds == DATASOURCE for _, ds in refs), [r for r in refs if r[1] != DATASOURCE]
    # no hard-coded datasource uid anywhere; the only ${DS_PROMETHEUS} seeds the datasource variable
    text = json.dumps(DASHES[rel])
    assert text.count("${DS_PROMETHEUS}") == 2


_SUM_COUNT = re.compile(r"([A-Za-z_:][\w:]*)_(sum|count)(\{[^}]*\})?(\[[^\]]+\])?")


def lifetime_averages(expr: str) -> list[str]:
    """``X_sum`` / ``X_count`` pairs not windowed by ``rate``/``increase`` (lifetime averages).

    Only families used as a pair count: a gauge that merely ends in ``_count``
    (Triton's ``nv_inference_pending_request_count``) is not an average.
    """
    found = list(_SUM_COUNT.finditer(expr))
    kinds: dict[str, set[str]] = {}
    for m in found:
        kinds.setdefault(m.group(1), set()).add(m.group(2))
    bad = []
    for m in found:
        if kinds[m.group(1)] != {"sum", "count"}:
            continue
        before = expr[: m.start()].rstrip()
        if not m.group(4) or not re.search(r"\b(rate|increase)\($", before):
            bad.append(m.group(0))
    return bad


def test_lint_detects_lifetime_average() -> None:
    assert lifetime_averages("vllm:x_sum / vllm:x_count")
    assert lifetime_averages('sum(x_sum{a="b"}) / sum(x_count{a="b"})')
    assert not lifetime_averages('sum(rate(x_sum{a="b"}[2m])) / sum(rate(x_count[2m]))')
    assert not lifetime_averages("max(nv_inference_pending_request_count)")


@pytest.mark.parametrize("rel", sorted(DASHES))
def test_no_lifetime_averages(rel: str) -> None:
    for title, expr in _exprs(DASHES[rel]):
        assert not lifetime_averages(expr), f"{title}: lifetime average in {expr}"


KV_NAMES = {s.metric for d in DIALECTS for s in d.sources.get(Signal.KV_USAGE, ())}


def kv_mean_without_max(panel: dict[str, Any]) -> bool:
    exprs = [t["expr"] for t in panel.get("targets", [])]
    uses_kv = [e for e in exprs if any(n in e for n in KV_NAMES)]
    mean = any(re.search(r"\bavg(_over_time)?\b", e) for e in uses_kv)
    has_max = any(re.search(r"\bmax(_over_time)?\b", e) for e in uses_kv)
    return mean and not has_max


def test_kv_usage_mean_never_alone() -> None:
    assert kv_mean_without_max({"targets": [{"expr": "avg by (model) (vllm:kv_cache_usage_perc)"}]})
    seen_mean = False
    for d in DASHES.values():
        for p in _panels(d):
            assert not kv_mean_without_max(p), p["title"]
            seen_mean |= any("avg by (model)" in t["expr"] for t in p.get("targets", []))
    assert seen_mean  # the fleet dashboard does show the mean - next to the max


def test_latency_quantiles_are_windowed_p50_p95_p99() -> None:
    fleet = {p["title"]: p for p in _panels(DASHES["dashboards/kvwatch-fleet.json"])}
    for title in ("Time to first token p50 / p95 / p99", "Inter-token latency p50 / p95 / p99"):
        exprs = [t["expr"] for t in fleet[title]["targets"]]
        for q in ("0.5", "0.95", "0.99"):
            assert any(f"histogram_quantile({q}," in e for e in exprs), (title, q)
        assert all("[$__rate_interval]" in e for e in exprs)


def test_every_dialect_kv_metric_appears_in_fleet_kv_panel() -> None:
    """Names come from the dialect table: every KV-usage source is in the KV panel."""
    fleet = {p["title"]: p for p in _panels(DASHES["dashboards/kvwatch-fleet.json"])}
    # measured and proxy dialects are separate targets of the panel (the proxy one is labelled so)
    expr = " ".join(t["expr"] for t in fleet["KV cache usage per instance"]["targets"])
    for d in DIALECTS:
        for s in d.sources.get(Signal.KV_USAGE, ()):
            assert s.promql('job=~"$job", instance=~"$instance"', "$__rate_interval") in expr


def test_instance_drilldown_annotations_and_triage() -> None:
    d = DASHES["dashboards/kvwatch-instance.json"]
    (ann,) = d["annotations"]["list"]
    assert "kvwatch_diagnosis_active" in ann["expr"] and "$instance" in ann["expr"]
    assert ann["datasource"] == DATASOURCE and ann["tagKeys"] == "mode,severity"
    text = next(p for p in d["panels"] if p["type"] == "text")["options"]["content"]
    for mode in ("full", "oscillating", "fragmented", "misread", "idle"):
        assert f"**{mode}**" in text
    assert "{" not in text  # rule placeholders are not shown raw


def test_fleet_links_to_drilldown() -> None:
    fleet = {p["title"]: p for p in _panels(DASHES["dashboards/kvwatch-fleet.json"])}
    links = fleet["KV cache usage per instance"]["fieldConfig"]["defaults"]["links"]
    assert links[0]["url"].startswith("/d/kvwatch-instance?var-instance=")
