"""Shards: kvwatch's split of the fleet is Prometheus' own ``hashmod`` (checked against a real Prometheus)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import requests
from support.prom import prometheus

from kvwatch.config import load_settings
from kvwatch.core.models import Target, TargetKey
from kvwatch.core.shard import Shard, hashmod, parse_shard
from kvwatch.errors import ConfigError

JOBS = ("vllm", "sglang-prod")
ADDRS = tuple(f"10.0.{i // 7}.{i}:{8000 + i % 3}" for i in range(30))


def _target(job: str, instance: str, model: str = "") -> Target:
    return Target(TargetKey(job, instance), "vllm-v1", "vllm", model)


def test_parse_shard_and_errors() -> None:
    assert parse_shard("1/4") == Shard(1, 4)
    assert not parse_shard("0/1").active
    for bad in ("4/4", "1", "a/2", "-1/2", "1/0", ""):
        with pytest.raises(ValueError, match="expected I/N"):
            parse_shard(bad)


def test_config_rejects_index_beyond_count() -> None:
    with pytest.raises(ConfigError, match=r"shard.index: got 3, expected below shard.count \(2\)"):
        load_settings(None, environ={}, overrides={"shard": {"index": 3, "count": 2}})
    s = load_settings(None, environ={"KVWATCH_SHARD_INDEX": "1", "KVWATCH_SHARD_COUNT": "3"})
    assert (s.shard.index, s.shard.count, s.shard.by) == (1, 3, "target")


def test_cli_bad_shard_is_one_line() -> None:
    res = subprocess.run([sys.executable, "-m", "kvwatch.cli", "once", "--shard", "2/2"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == ["kvwatch: config: --shard: got '2/2', expected I/N with 0 <= I < N, e.g. 0/2"]


@pytest.mark.parametrize("count", [2, 3, 4, 7])
def test_every_target_in_exactly_one_shard(count: int) -> None:
    targets = [_target(j, a) for j in JOBS for a in ADDRS]
    owners = {t.key: [i for i in range(count) if Shard(i, count).owns(t)] for t in targets}
    assert all(len(o) == 1 for o in owners.values())
    sizes = [sum(o == [i] for o in owners.values()) for i in range(count)]
    assert min(sizes) > 0 and max(sizes) < 2.5 * len(targets) / count  # roughly even


def test_group_sharding_keeps_a_model_together() -> None:
    targets = [_target("vllm", a, model=f"m{i % 5}") for i, a in enumerate(ADDRS)]
    for i in range(3):
        mine = Shard(i, 3, by="group").select(targets)
        assert {t.model for t in mine}.isdisjoint(
            {t.model for t in targets if t not in mine}), "a model is split across shards"


@pytest.mark.prometheus
def test_hashmod_equals_prometheus_relabelling() -> None:
    """Prometheus' hashmod over (job, instance) puts every target in the shard kvwatch computes."""
    modulus = 4
    jobs = "".join(
        f"  - job_name: {job}\n    static_configs:\n      - targets: [{', '.join(repr(a) for a in ADDRS)}]\n"
        f"    relabel_configs:\n"
        f"      - {{source_labels: [job, __address__], modulus: {modulus}, target_label: shard, action: hashmod}}\n"
        for job in JOBS
    )
    config = f"global:\n  scrape_interval: 1h\nscrape_configs:\n{jobs}"
    with prometheus(config=config) as url:
        deadline, active = time.monotonic() + 30, []
        while time.monotonic() < deadline and len(active) < len(JOBS) * len(ADDRS):
            active = requests.get(f"{url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            time.sleep(0.2)
    assert len(active) == len(JOBS) * len(ADDRS)
    for t in active:
        labels = t["labels"]
        want = int(labels["shard"])
        assert hashmod((labels["job"], labels["instance"]), modulus) == want, labels
        assert Shard(want, modulus).owns(_target(labels["job"], labels["instance"]))
