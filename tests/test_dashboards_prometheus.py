"""Every query of the kvwatch-self dashboard returns data from a real Prometheus.

The Prometheus holds a backfilled sample of kvwatch's self-metrics (names as in
kvwatch/service/selfmetrics.py). Engine panels need simulator data: see docs/dashboards.md.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests
from support.prom import backfill, prometheus

ROOT = Path(__file__).resolve().parents[1]
VARS = {"$__rate_interval": "2m", "$job": ".*", "$instance": ".*"}
STEP, POINTS = 15, 121  # 30 minutes


def _self_metrics_openmetrics(end: int) -> str:
    lines = [
        "# TYPE kvwatch_cycles counter",
        "# TYPE kvwatch_queries counter",
        "# TYPE kvwatch_query_errors counter",
        "# TYPE kvwatch_notifications counter",
        "# TYPE kvwatch_cycle_duration_seconds histogram",
        "# TYPE kvwatch_last_cycle_timestamp_seconds gauge",
        "# TYPE kvwatch_targets gauge",
        "# TYPE kvwatch_target_missing_signals gauge",
        "# TYPE kvwatch_incidents_open gauge",
    ]
    k = 'job="kvwatch",instance="kvwatch:9877"'
    body: dict[str, list[str]] = {}
    for i in range(POINTS):
        ts = end - (POINTS - 1 - i) * STEP
        n = i // 4  # one cycle per minute
        add = body.setdefault
        add("kvwatch_cycles", []).append(f'kvwatch_cycles_total{{{k},outcome="ok"}} {n} {ts}')
        add("kvwatch_queries", []).append(f"kvwatch_queries_total{{{k}}} {n * 30} {ts}")
        add("kvwatch_query_errors", []).append(f"kvwatch_query_errors_total{{{k}}} {n // 10} {ts}")
        add("kvwatch_notifications", []).append(
            f'kvwatch_notifications_total{{{k},sink="slack",outcome="ok"}} {n // 5} {ts}'
        )
        h = body.setdefault("kvwatch_cycle_duration_seconds", [])
        for le, frac in (("0.5", 0.2), ("1.0", 0.9), ("+Inf", 1.0)):
            h.append(f'kvwatch_cycle_duration_seconds_bucket{{{k},le="{le}"}} {int(n * frac)} {ts}')
        h.append(f"kvwatch_cycle_duration_seconds_sum{{{k}}} {n * 0.7:.1f} {ts}")
        h.append(f"kvwatch_cycle_duration_seconds_count{{{k}}} {n} {ts}")
        add("kvwatch_last_cycle_timestamp_seconds", []).append(
            f"kvwatch_last_cycle_timestamp_seconds{{{k}}} {ts - ts % 60} {ts}"
        )
        for state, v in (("healthy", 3), ("full", 1), ("unknown", 1)):
            add("kvwatch_targets", []).append(f'kvwatch_targets{{{k},state="{state}"}} {v} {ts}')
        # honor_labels: per-target series carry the engine target's job/instance
        add("kvwatch_target_missing_signals", []).append(
            f'kvwatch_target_missing_signals{{job="trtllm",instance="gena:8000"}} 9 {ts}'
        )
        add("kvwatch_incidents_open", []).append(
            f'kvwatch_incidents_open{{{k},mode="full",severity="critical"}} 1 {ts}'
        )
    # OpenMetrics wants each family's samples contiguous; TYPE lines precede them
    ordered: list[str] = []
    for fam_name, samples in body.items():
        ordered.append(next(x for x in lines if x.startswith(f"# TYPE {fam_name} ")))
        ordered += samples
    return "\n".join(ordered) + "\n# EOF\n"


def _substitute(expr: str) -> str:
    for var, val in VARS.items():
        expr = expr.replace(var, val)
    return expr


@pytest.mark.prometheus
@pytest.mark.slow
def test_every_self_dashboard_query_returns_data(tmp_path: Path) -> None:
    end = (int(time.time()) // 3600 - 3) * 3600  # a past instant outside the head block
    backfill(_self_metrics_openmetrics(end), tmp_path / "tsdb")
    dash = json.loads((ROOT / "dashboards" / "kvwatch-self.json").read_text())
    queries = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    assert queries
    empty = []
    with prometheus(tsdb=tmp_path / "tsdb") as url:
        for title, expr in queries:
            r = requests.get(f"{url}/api/v1/query", params={"query": _substitute(expr), "time": end - 60}, timeout=10)
            assert r.status_code == 200, f"{title}: {r.text[:300]}"
            if not r.json()["data"]["result"]:
                empty.append(title)
    assert not empty, f"panels whose query matches nothing: {empty}"
