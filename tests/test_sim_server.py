"""Live simulator server: endpoints, compressed clock, live control, real Prometheus SD."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from support.prom import prometheus

from kvwatch.sim.corpus import plan
from kvwatch.sim.server import CONTENT_TYPE_004, SimFleet, SimHTTPServer


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served() -> Iterator[tuple[SimHTTPServer, SimFleet, FakeClock]]:
    clock = FakeClock()
    specs = plan(["full", "healthy-light", "misread-imbalance"], ["vllm-0.33", "trtllm-triton"],
                 1, run_s=None)
    fleet = SimFleet(specs, speed=30.0, warmup_s=120.0, clock=clock)
    with SimHTTPServer(fleet, "127.0.0.1", 0) as server:
        yield server, fleet, clock


def gauge(text: str, name: str) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                return s.value
    raise KeyError(name)


def test_endpoints_and_sd_contract(served: tuple[SimHTTPServer, SimFleet, FakeClock]) -> None:
    server, fleet, _ = served
    base = server.url
    r = requests.get(f"{base}/healthz", timeout=10)
    assert r.status_code == 200 and r.text == "ok\n"
    sd = requests.get(f"{base}/sd", timeout=10).json()
    host = base.removeprefix("http://")
    assert [e["labels"]["instance"] for e in sd] == list(fleet.targets)
    for entry in sd:
        name = entry["labels"]["instance"]
        assert entry == {"targets": [host], "labels": {
            "__metrics_path__": f"/targets/{name}/metrics", "instance": name,
            "kvwatch_sim_target": name}}
    manifest = requests.get(f"{base}/targets", timeout=10).json()
    assert {t["name"] for t in manifest} == set(fleet.targets)
    assert {t["expected"] for t in manifest} == {"full", "healthy"}
    assert {t["group_expected"] for t in manifest if t["group"]} == {"misread"}
    for entry in sd:
        r = requests.get(base + entry["labels"]["__metrics_path__"], timeout=10)
        assert r.status_code == 200 and r.headers["Content-Type"] == CONTENT_TYPE_004
        assert list(text_string_to_metric_families(r.text))
    assert requests.get(f"{base}/targets/nope/metrics", timeout=10).status_code == 404
    assert requests.get(f"{base}/elsewhere", timeout=10).status_code == 404


def test_compressed_clock_and_live_control(
        served: tuple[SimHTTPServer, SimFleet, FakeClock]) -> None:
    server, fleet, clock = served
    name = "sim-full-vllm-0.33-0"
    url = f"{server.url}/targets/{name}/metrics"
    first = requests.get(url, timeout=10).text
    assert fleet.targets[name].engines[0].t == pytest.approx(120.0)  # warm-up only
    clock.now += 10  # 10 wall seconds at x30
    second = requests.get(url, timeout=10).text
    assert fleet.targets[name].engines[0].t == pytest.approx(420.0)
    gen = 'vllm:generation_tokens_total'
    assert gauge(second, gen) > gauge(first, gen)
    r = requests.post(f"{server.url}/control/{name}", json={"scenario": "idle-stalled"},
                      timeout=10)
    assert r.status_code == 200 and r.json()["expected"] == "idle"
    assert r.json()["cause"] == "stalled"
    clock.now += 40  # 1200 simulated seconds: the stall began, clients gave up on running ones
    text = requests.get(url, timeout=10).text
    assert gauge(text, "vllm:num_requests_running") == 0
    assert gauge(text, "vllm:num_requests_waiting") > 0
    clock.now += 5
    assert gauge(requests.get(url, timeout=10).text, gen) == gauge(text, gen)  # no progress
    bad = requests.post(f"{server.url}/control/{name}", json={"scenario": "nope"}, timeout=10)
    assert bad.status_code == 400 and "unknown scenario" in bad.json()["error"]
    assert requests.post(f"{server.url}/control/{name}", data="{not json", timeout=10
                         ).status_code == 400
    assert requests.post(f"{server.url}/control/ghost", json={}, timeout=10).status_code == 404


def test_clean_shutdown_releases_the_port() -> None:
    fleet = SimFleet(plan(["healthy-light"], ["sglang-0.5"], 1, run_s=None))
    server = SimHTTPServer(fleet, "127.0.0.1", 0).start()
    host, port = server.server_address[:2]
    assert requests.get(f"{server.url}/healthz", timeout=10).ok
    server.close()
    with pytest.raises(OSError):  # nothing listens any more
        socket.create_connection((host, port), timeout=2).close()


@pytest.mark.prometheus
def test_real_prometheus_discovers_and_scrapes_the_fleet() -> None:
    specs = plan(["full", "idle-low-demand"], ["sglang-0.5", "trtllm-serve"], 1, run_s=None)
    fleet = SimFleet(specs, speed=20.0, warmup_s=60.0)
    with SimHTTPServer(fleet, "127.0.0.1", 0) as server:
        config = ("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
                  "  - job_name: kvwatch-sim\n    http_sd_configs:\n"
                  f"      - url: {server.url}/sd\n        refresh_interval: 1s\n")
        with prometheus(config=config) as url:
            deadline = time.monotonic() + 60
            up: dict[str, float] = {}
            while time.monotonic() < deadline and len(up) < len(specs):
                r = requests.get(f"{url}/api/v1/query", params={"query": "up == 1"}, timeout=10)
                up = {x["metric"]["instance"]: float(x["value"][1])
                      for x in r.json()["data"]["result"]}
                time.sleep(0.5)
            assert set(up) == {s.name for s in specs}
            r = requests.get(f"{url}/api/v1/query", timeout=10,
                             params={"query": "count by (kvwatch_sim_target) "
                                              "({__name__=~'sglang:token_usage|"
                                              "trtllm_kv_cache_utilization'})"})
            assert len(r.json()["data"]["result"]) == len(specs)
