"""OpenMetrics backfill file: structure, manifest, and a real promtool + Prometheus round trip."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
import requests
from support.prom import prometheus, require_binary

from kvwatch.sim.corpus import default_end_time, manifest, run_fleet
from kvwatch.sim.fleet import TargetRun, make_targets
from kvwatch.sim.openmetrics import backfill, write_openmetrics
from kvwatch.sim.validate import Validation
from kvwatch.sim.vocab import Dialect

DURATION = 2100.0
END = default_end_time()
_PRESETS = ("full", "healthy-light", "oscillating", "fragmented", "idle-batch-limited", "full",
            "healthy-busy", "full", "idle-stalled", "misread-tail")
# new dialects reuse the presets in turn
PRESET_OF = {d: _PRESETS[i % len(_PRESETS)] for i, d in enumerate(Dialect)}
SAMPLE = re.compile(r'^([A-Za-z_:][\w:]*)\{(.*)\} (\S+) (\S+)$')


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[TargetRun,
                                                                             Validation]]]:
    specs = []
    for d, preset in PRESET_OF.items():
        dp = 2 if d is Dialect.VLLM_0_33 else 1
        specs += make_targets(preset, d, 1, run_s=DURATION + 300, data_parallel=dp)
    specs[1] = replace(specs[1], restart_at_s=1500.0)  # a counter reset inside the span
    results = run_fleet(specs, duration_s=DURATION, end_time=END, workers=2)
    path = tmp_path_factory.mktemp("om") / "fleet.om"
    write_openmetrics([r for r, _ in results], path)
    return path, results


def test_file_is_valid_openmetrics_for_backfill(fleet: tuple[Path, list]) -> None:
    path, _ = fleet
    lines = path.read_text().splitlines()
    assert lines[-1] == "# EOF" and lines.count("# EOF") == 1
    declared: dict[str, str] = {}
    family = kind = None
    last_ts: dict[str, float] = {}
    for line in lines[:-1]:
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ")
            assert family not in declared, f"family {family} not contiguous"
            declared[family] = kind
            assert kind in {"counter", "gauge", "histogram", "unknown"}
            assert kind != "counter" or not family.endswith("_total")
            continue
        if line.startswith("# HELP "):
            assert line.split(" ")[2] == family
            continue
        m = SAMPLE.match(line)
        assert m, line
        name, labels, _value, ts = m.groups()
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                    "gauge": ("",), "unknown": ("",)}[kind]
        assert name in {family + s for s in suffixes}, (family, name)
        label_names = set(re.findall(r'(\w+)="', labels))
        assert {"job", "instance"} <= label_names
        assert not label_names & {"expected", "preset", "seed", "cause", "kvwatch_sim_expected"}
        series = f"{name}{{{labels}}}"
        assert float(ts) > last_ts.get(series, 0.0), f"{series} out of order"
        last_ts[series] = float(ts)
    assert declared["vllm:num_preemptions"] == "counter"
    assert declared["nv_inference_request_success"] == "unknown"  # Triton: no _total
    ends = {float(t) for t in last_ts.values()}
    assert ends == {END}


def test_manifest_describes_targets_without_touching_metrics(fleet: tuple[Path, list]) -> None:
    _, results = fleet
    doc = manifest(results, job="kvwatch-sim", port=8000, duration_s=DURATION, warmup_s=300,
                   scrape_interval_s=15, end_time=END)
    json.dumps(doc)  # JSON-able
    assert doc["end_unix"] == END and doc["start_unix"] == END - DURATION
    first = doc["targets"][0]
    assert first["instance"] == f"{first['name']}:8000"
    assert first["labels"] == {"instance": first["instance"], "job": "kvwatch-sim"}
    assert {"dialect", "preset", "seed", "expected", "cause", "group", "engine_config",
            "validation"} <= set(first)
    assert all(t["validation"]["ok"] for t in doc["targets"]), [
        (t["name"], t["validation"]["observed"]) for t in doc["targets"]
        if not t["validation"]["ok"]]


@pytest.mark.prometheus
def test_backfilled_series_are_served_by_a_real_prometheus(
        fleet: tuple[Path, list], tmp_path: Path) -> None:
    path, results = fleet
    require_binary("promtool")
    backfill(path, tmp_path / "tsdb")
    expected_series: dict[str, int] = defaultdict(int)
    for line in path.read_text().splitlines():
        m = re.search(r'instance="([^"]+)"', line)
        if m and not line.startswith("#"):
            expected_series[m.group(1)] += 1
    with prometheus(tmp_path / "tsdb") as url:
        def query(q: str) -> list[dict]:
            r = requests.get(f"{url}/api/v1/query", params={"query": q, "time": END}, timeout=30)
            r.raise_for_status()
            return r.json()["data"]["result"]

        counts = {r["metric"]["instance"]: float(r["value"][1])
                  for r in query('count by (instance) ({job="kvwatch-sim"})')}
        samples_per_series = DURATION / 15 + 1
        assert counts == {i: n / samples_per_series for i, n in expected_series.items()}
        run = results[0][0]  # vllm-0.33, two data-parallel engines
        usage = {r["metric"]["engine"]: float(r["value"][1]) for r in query(
            f'vllm:kv_cache_usage_perc{{instance="{run.spec.instance()}"}}')}
        truth = {str(i): float(tr.gauge("usage")[tr.hist_idx[-1]])
                 for i, tr in enumerate(run.traces)}
        assert usage == pytest.approx(truth)
        restarted = results[1][0].spec.instance()
        resets = query(f'resets(vllm:generation_tokens_total{{instance="{restarted}"}}[40m])')
        assert float(resets[0]["value"][1]) >= 1
        assert query("rate(nv_inference_request_success[5m]) > 0")  # counter without _total
        assert query('histogram_quantile(0.99, sum by (le) '
                     '(rate(sglang:time_to_first_token_seconds_bucket[5m])))')
