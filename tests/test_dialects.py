"""Sanity of the dialect table: real metric names, PromQL the real parser accepts, detection."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from support.prom import PROMTOOL, require_binary

from kvwatch.core.collect import resolve
from kvwatch.core.dialects import BY, DIALECT_BY_ID, DIALECTS, Source, SourceKind, all_names
from kvwatch.core.discover import discovery_query, parse_discovery, stale_query
from kvwatch.core.models import TargetKey
from kvwatch.core.selector import parse_selector, render_matchers
from kvwatch.core.signals import ONLY_WITHOUT, Signal

NAMES_FILE = Path(__file__).parent / "fixtures" / "core" / "engine-metric-names.txt"
#: names read in upstream source for engines engine-metrics.md does not cover (file per block)
UPSTREAM_FILE = Path(__file__).parent / "fixtures" / "engines" / "upstream-metric-names.txt"
DOC_NAMES = {
    ln.strip()
    for f in (NAMES_FILE, UPSTREAM_FILE)
    for ln in f.read_text().splitlines()
    if ln.strip() and not ln.startswith("#")
}
TRICKY = render_matchers(parse_selector('{ns="a\\"b\\\\c", pod=~"vllm-.*|ü", team!="x,y}"}'))
SOURCES = [(d.id, sig, s) for d in DIALECTS for sig, srcs in d.sources.items() for s in srcs]


def _doc_name(name: str) -> str:
    # Ray Serve re-exports the native families as ray_vllm_* / ray_sglang_* (older Ray: ray_vllm:*)
    return re.sub(r"^ray_(vllm|sglang)[_:]", r"\1:", name)


def test_every_dialect_has_kv_usage_except_unprefixed_trtllm_serve() -> None:
    without = {d.id for d in DIALECTS if not d.sources.get(Signal.KV_USAGE)}
    assert without == {"trtllm-serve-legacy", "trtllm-triton-llmapi"}
    assert DIALECT_BY_ID["trtllm-triton-llmapi"].blind_reason  # recognised, and says why it is blind


def test_ids_unique_and_engines_known() -> None:
    assert len(DIALECT_BY_ID) == len(DIALECTS)
    assert {d.engine for d in DIALECTS} == {"vllm", "sglang", "trtllm", "lmdeploy", "tgi", "dynamo"}


@pytest.mark.parametrize(("dialect", "signal", "source"), SOURCES, ids=lambda x: str(x)[:40])
def test_source_names_are_documented_engine_metrics(dialect: str, signal: Signal, source: Source) -> None:
    for name in source.family_names:
        # a histogram's _sum/_count series exist wherever its documented family does (exposition format)
        family = re.sub(r"_(sum|count)$", "", name)
        assert _doc_name(name) in DOC_NAMES or _doc_name(family) in DOC_NAMES, (
            f"{dialect}/{signal}: {name} not in engine-metrics.md")


@pytest.mark.parametrize("dialect", [d.id for d in DIALECTS])
def test_markers_are_documented_names(dialect: str) -> None:
    for m in DIALECT_BY_ID[dialect].markers:
        name = m.removesuffix("_count")
        assert _doc_name(name) in DOC_NAMES or _doc_name(m) in DOC_NAMES, m


def test_counters_are_queried_with_rate_and_total_suffix() -> None:
    for dialect, sig, s in SOURCES:
        q = s.promql("", "2m")
        if s.kind is SourceKind.COUNTER:
            assert "rate(" in q, (dialect, sig)
            # prometheus_client counters carry _total on the wire; Triton's C++ counters and TGI's Rust
            # exporter may not; SGLang's total_retracted_reqs is a cumulative total declared as a gauge.
            # A histogram's _sum and _count series are monotonic counters too (the signal
            # fallbacks read them when an engine exports no token/request counter): rated alike.
            assert s.metric.endswith(("_total", "total_retracted_reqs", "_sum", "_count")) or s.metric.startswith(
                ("nv_", "tgi_")), (dialect, sig, s.metric)
            if s.metric.endswith(("_sum", "_count")) and not s.metric.startswith(("nv_", "tgi_")):
                family = s.metric.rsplit("_", 1)[0]
                assert _doc_name(family) in DOC_NAMES, f"{dialect}/{sig}: {family} is no documented histogram"
        if s.kind is SourceKind.HIST_QUANTILE:
            assert f"{s.metric}_bucket" in q and "le)" in q and f"histogram_quantile({s.quantile}" in q
        if s.kind is not SourceKind.VLLM_CACHE_INFO:
            assert f"by ({BY}" in q, (dialect, sig, q)


def test_user_matchers_scope_every_selector() -> None:
    for dialect, sig, s in SOURCES:
        q = s.promql('zone="eu"', "2m")
        selectors = re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*\{[^}]*\}", q)
        assert selectors, q
        for sel in selectors:
            assert 'zone="eu"' in sel, (dialect, sig, sel)


def test_every_query_parses_with_promtool(tmp_path: Path) -> None:
    """The real PromQL parser (``promtool check rules``) accepts every query kvwatch can send."""
    promtool = require_binary(PROMTOOL)
    exprs = {discovery_query(""), discovery_query(TRICKY), stale_query("", 1800), stale_query(TRICKY, 90)}
    for _, _, s in SOURCES:
        exprs |= {s.promql("", "2m"), s.promql(TRICKY, "1m30s")}
    rules = [{"record": f"kvwatch:check_{i}", "expr": e} for i, e in enumerate(sorted(exprs))]
    f = tmp_path / "rules.yaml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "kvwatch", "rules": rules}]}, allow_unicode=True))
    res = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(rules)} rules found" in res.stdout


def test_all_names_is_the_discovery_vocabulary() -> None:
    names = all_names()
    assert names == sorted(set(names))
    for d in DIALECTS:
        assert d.names() <= set(names)


def _rows(job: str, instance: str, names: list[str], **labels: str) -> list[dict]:
    return [{"metric": {"__name__": n, "job": job, "instance": instance, **labels}, "value": [0, "1"]} for n in names]


def _names(dialect: str) -> list[str]:
    return sorted(DIALECT_BY_ID[dialect].names())


@pytest.mark.parametrize(
    ("names", "labels", "dialect"),
    [
        (["vllm:kv_cache_usage_perc", "vllm:num_requests_running"], {"model_name": "m"}, "vllm-v1"),
        (["vllm:gpu_cache_usage_perc", "vllm:num_requests_running"], {"model_name": "m"}, "vllm-v1"),
        (["vllm:gpu_cache_usage_perc", "vllm:num_requests_swapped"], {"model_name": "m"}, "vllm-v0"),
        (["sglang:token_usage", "sglang:num_running_reqs"], {"model_name": "m"}, "sglang"),
        (["ray_sglang_token_usage", "ray_sglang_num_running_reqs"], {"model_name": "m"}, "sglang-ray"),
        (["ray_vllm_kv_cache_usage_perc", "ray_vllm_num_requests_running"], {"model_name": "m"}, "vllm-ray"),
        (["ray_vllm:gpu_cache_usage_perc", "ray_vllm:num_requests_running"], {"model_name": "m"}, "vllm-ray-colon"),
        # Triton core metrics alone: the LLM-API backend when the model is the LLM, else no engine
        (["nv_inference_request_success", "nv_inference_queue_duration_us"], {"model": "tensorrt_llm"},
         "trtllm-triton-llmapi"),
        (["nv_inference_request_success", "nv_inference_queue_duration_us"], {"model": "resnet50"}, None),
        (["nv_trt_llm_kv_cache_block_metrics", "nv_trt_llm_request_metrics"], {"model": "tensorrt_llm"},
         "trtllm-triton"),
        (["trtllm_kv_cache_utilization", "trtllm_time_to_first_token_seconds_count"], {"model_name": "m"},
         "trtllm-serve"),
        (["time_to_first_token_seconds_count", "request_success_total"],
         {"model_name": "undefined", "engine_type": "undefined"}, "trtllm-serve-legacy"),
        (["time_to_first_token_seconds_count", "request_success_total"], {"model_name": "x"}, None),
    ],
)
def test_detection(names: list[str], labels: dict[str, str], dialect: str | None) -> None:
    targets = parse_discovery(_rows("j", "i:1", names, **labels))
    assert [t.dialect for t in targets] == ([dialect] if dialect else [])


def test_router_look_alike_and_data_parallel_engines() -> None:
    rows = _rows("router", "r:1", ["vllm:num_requests_running", "vllm:num_requests_swapped"], server="http://e:8000")
    rows += _rows("vllm", "e:8000", ["vllm:kv_cache_usage_perc", "vllm:num_requests_running"],
                  model_name="m", engine="0")
    rows += _rows("vllm", "e:8000", ["vllm:kv_cache_usage_perc", "vllm:num_requests_running"],
                  model_name="m", engine="1")
    targets = parse_discovery(rows)
    assert [(t.key, t.dialect, t.model) for t in targets] == [(TargetKey("vllm", "e:8000"), "vllm-v1", "m")]


def test_allowed_dialects_filter() -> None:
    rows = _rows("a", "a:1", ["sglang:token_usage"], model_name="m") + _rows("b", "b:1", ["vllm:kv_cache_usage_perc"],
                                                                               model_name="m")
    assert [t.dialect for t in parse_discovery(rows, allowed=("sglang",))] == ["sglang"]


@pytest.mark.parametrize("dialect", [d.id for d in DIALECTS])
def test_resolution_prefers_the_first_available_source(dialect: str) -> None:
    d = DIALECT_BY_ID[dialect]
    rows = _rows("j", "i:1", _names(dialect), model_name="m", engine_type="x", model="tensorrt_llm")
    (t,) = parse_discovery(rows, allowed=(dialect,))
    got = resolve(t)
    # a stand-in (ONLY_WITHOUT) is left out beside the signal it stands in for
    stand_ins = {s for s, preferred in ONLY_WITHOUT.items() if preferred in d.sources}
    assert set(got) == set(d.sources) - stand_ins
    for sig, src in got.items():
        assert src == d.sources[sig][0]
