"""deploy/kubernetes: manifests parse and hang together; the scrape config really relabels.

No cluster here: manifests are checked structurally, the kvwatch config and rules
with ``kvwatch check``, and the engine scrape config with the real ``promtool``
and a real Prometheus scraping a loopback target.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from support.prom import free_port, prometheus, require_binary

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "kubernetes"
SCRAPE = K8S / "prometheus-engines-scrape.yml"


def _docs() -> dict[str, list[dict[str, Any]]]:
    out = {}
    for f in sorted(K8S.glob("*.yaml")):
        out[f.name] = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
    return out


@pytest.fixture(scope="module")
def docs() -> dict[str, list[dict[str, Any]]]:
    return _docs()


def _objects(docs: dict[str, list[dict[str, Any]]], kind: str) -> list[dict[str, Any]]:
    return [d for ds in docs.values() for d in ds if d.get("kind") == kind]


def _kvwatch_containers(docs: dict[str, list[dict[str, Any]]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(where, pod spec, container) for the Deployment and the sidecar patch."""
    dep = next(d for d in _objects(docs, "Deployment") if d["metadata"]["name"] == "kvwatch")
    patch = docs["prometheus-sidecar-patch.yaml"][0]
    out = []
    for where, spec in (("deployment", dep["spec"]["template"]["spec"]), ("sidecar", patch["spec"]["template"]["spec"])):
        out.append((where, spec, next(c for c in spec["containers"] if c["name"] == "kvwatch")))
    return out


def test_every_object_is_complete(docs: dict[str, list[dict[str, Any]]]) -> None:
    kinds = set()
    for name, ds in docs.items():
        if name in ("kustomization.yaml", "prometheus-sidecar-patch.yaml"):
            continue
        for d in ds:
            assert d.get("apiVersion") and d.get("kind"), name
            assert d["metadata"].get("name") and d["metadata"].get("namespace") == "monitoring", name
            kinds.add(d["kind"])
    assert {"ConfigMap", "Secret", "Deployment", "Service", "ServiceMonitor", "PersistentVolumeClaim"} <= kinds
    sm = _objects(docs, "ServiceMonitor")[0]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"


def test_kustomization_lists_existing_files_but_not_the_secret(docs: dict[str, list[dict[str, Any]]]) -> None:
    res = docs["kustomization.yaml"][0]["resources"]
    assert all((K8S / r).is_file() for r in res)
    assert "secret.example.yaml" not in res  # never overwrite a real token with the placeholder
    assert {"config.yaml", "rules.yaml", "deployment.yaml", "service.yaml"} <= set(res)


def test_probes_resources_and_ports(docs: dict[str, list[dict[str, Any]]]) -> None:
    for where, spec, c in _kvwatch_containers(docs):
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert 9877 in ports.values(), where
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            get = c[probe]["httpGet"]
            assert get["path"] == path, (where, probe)
            assert get["port"] in ports or get["port"] == 9877, (where, probe)
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][kind]), (where, kind)
        assert c["args"] == ["run", "--config", "/etc/kvwatch/config.yaml"]
        assert c["image"].split(":")[-1] not in ("", "latest")
        sec = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
        assert sec.get("runAsNonRoot") is True and sec.get("allowPrivilegeEscalation") is False, where
        # every mounted volume is declared and every ConfigMap it names is shipped
        declared = {v["name"]: v for v in spec["volumes"]}
        cms = {d["metadata"]["name"] for d in _objects(docs, "ConfigMap")}
        for m in c["volumeMounts"]:
            vol = declared[m["name"]]
            if "configMap" in vol:
                assert vol["configMap"]["name"] in cms, (where, vol)
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert {"/etc/kvwatch/config.yaml", "/etc/kvwatch/rules", "/var/lib/kvwatch"} <= mounts, where


def test_slack_secret_is_referenced_never_inlined(docs: dict[str, list[dict[str, Any]]]) -> None:
    secret = _objects(docs, "Secret")[0]
    keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    for where, _spec, c in _kvwatch_containers(docs):
        env = {e["name"]: e for e in c["env"]}
        for var, key in (("SLACK_BOT_TOKEN", "bot-token"), ("SLACK_CHANNEL", "channel"), ("SLACK_WEBHOOK_URL", "webhook-url")):
            assert "value" not in env[var], f"{where}: {var} inlined"
            ref = env[var]["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] == key, where
        assert keys & {"bot-token", "webhook-url"}
        assert "xox" not in json.dumps(c)
    for name in ("deployment.yaml", "prometheus-sidecar-patch.yaml", "config.yaml"):
        assert "xox" not in (K8S / name).read_text(), name


def test_sidecar_reads_prometheus_over_loopback(docs: dict[str, list[dict[str, Any]]]) -> None:
    (_, _, c) = _kvwatch_containers(docs)[1]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["KVWATCH_PROMETHEUS_URL"] == "http://127.0.0.1:9090"


def test_service_and_servicemonitor_select_kvwatch(docs: dict[str, list[dict[str, Any]]]) -> None:
    dep = next(d for d in _objects(docs, "Deployment") if d["metadata"]["name"] == "kvwatch")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    svc = _objects(docs, "Service")[0]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    port = svc["spec"]["ports"][0]
    assert port["port"] == 9877
    sm = _objects(docs, "ServiceMonitor")[0]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == port["name"]
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    assert sm["spec"]["endpoints"][0].get("honorLabels") is True  # issue 17 item 16 (docs/dashboards.md)
    for obj in (dep["spec"]["template"]["metadata"], docs["prometheus-sidecar-patch.yaml"][0]["spec"]["template"]["metadata"]):
        ann = obj["annotations"]
        assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "9877"


def test_rules_configmap_is_in_sync_with_bundled_rules() -> None:
    spec = importlib.util.spec_from_file_location("sync_rules", K8S / "sync_rules.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (K8S / "rules.yaml").read_text() == mod.render(), "run: python deploy/kubernetes/sync_rules.py"


def test_configmap_config_and_rules_pass_kvwatch_check(docs: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    cms = {d["metadata"]["name"]: d for d in _objects(docs, "ConfigMap")}
    cfg = tmp_path / "config.yaml"
    cfg.write_text(cms["kvwatch-config"]["data"]["config.yaml"])
    rules = tmp_path / "rules"
    rules.mkdir()
    for name, text in cms["kvwatch-rules"]["data"].items():
        (rules / name).write_text(text)
    # the config names the in-container rules path; --rules points at the extracted copy
    assert yaml.safe_load(cfg.read_text())["rules"]["paths"] == ["/etc/kvwatch/rules"]
    exe = shutil.which("kvwatch")
    cmd = [exe] if exe else [sys.executable, "-m", "kvwatch.cli"]
    res = subprocess.run([*cmd, "check", "--config", str(cfg), "--rules", str(rules)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    from kvwatch.core.rules import load_ruleset

    assert len(load_ruleset([rules]).rules) == len(load_ruleset().rules)


# ------------------------------------------------------- engine scrape config


def _scrape_job() -> dict[str, Any]:
    return yaml.safe_load(SCRAPE.read_text())["scrape_configs"][0]


def _with_file_sd(sd_file: Path) -> str:
    """The scrape config with kubernetes_sd swapped for file_sd.

    Debian's Prometheus is built without Kubernetes SD, so promtool rejects the
    key itself; the relabelling (the part users get wrong) is checked for real.
    """
    cfg = yaml.safe_load(SCRAPE.read_text())
    job = cfg["scrape_configs"][0]
    assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
    job["file_sd_configs"] = [{"files": [str(sd_file)], "refresh_interval": "1s"}]
    job["scrape_interval"] = "1s"
    cfg["global"]["scrape_interval"] = "1s"
    return yaml.safe_dump(cfg)


def test_scrape_config_keeps_namespace_pod_and_sets_instance() -> None:
    job = _scrape_job()
    relabel = job["relabel_configs"]
    targets = {r.get("target_label") for r in relabel}
    assert {"namespace", "pod", "instance", "__address__"} <= targets
    assert any(r.get("action") == "keep" for r in relabel)


def test_scrape_config_passes_promtool(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    sd = tmp_path / "sd.json"
    sd.write_text("[]")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(_with_file_sd(sd))
    res = subprocess.run([promtool, "check", "config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


class _Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.5\n'
        self.send_response(200 if self.path == "/custom-metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def engine_endpoint() -> Iterator[int]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.prometheus
def test_relabelling_with_a_real_prometheus(tmp_path: Path, engine_endpoint: int) -> None:
    """Pods as Kubernetes SD would present them: only the annotated one is scraped, on the annotated port and path."""
    def pod(name: str, scrape: str) -> dict[str, Any]:
        return {
            "targets": [f"127.0.0.1:{free_port()}"],  # declared container port: must be replaced
            "labels": {
                "__meta_kubernetes_namespace": "llm",
                "__meta_kubernetes_pod_name": name,
                "__meta_kubernetes_pod_annotation_prometheus_io_scrape": scrape,
                "__meta_kubernetes_pod_annotation_prometheus_io_port": str(engine_endpoint),
                "__meta_kubernetes_pod_annotation_prometheus_io_path": "/custom-metrics",
                "__meta_kubernetes_pod_label_app_kubernetes_io_name": "vllm",
            },
        }

    sd = tmp_path / "sd.json"
    sd.write_text(json.dumps([pod("vllm-0", "true"), pod("other-0", "false")]))
    with prometheus(config=_with_file_sd(sd)) as url:
        deadline = time.monotonic() + 30
        rows: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not rows:
            r = requests.get(f"{url}/api/v1/query", params={"query": "vllm:kv_cache_usage_perc"}, timeout=5)
            rows = r.json()["data"]["result"]
            time.sleep(0.3)
        assert len(rows) == 1, rows
        labels = rows[0]["metric"]
        assert labels["instance"] == "llm/vllm-0"
        assert labels["namespace"] == "llm" and labels["pod"] == "vllm-0"
        assert labels["job"] == "llm-engines" and labels["app"] == "vllm"
        targets = requests.get(f"{url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        assert [t["labels"]["pod"] for t in targets] == ["vllm-0"]
        assert targets[0]["scrapeUrl"] == f"http://127.0.0.1:{engine_endpoint}/custom-metrics"


def test_sharded_statefulset_maps_ordinal_to_shard_index(tmp_path: Path) -> None:
    """Each pod's ordinal is its shard index; the count equals the replicas; state per pod."""
    sts = yaml.safe_load((K8S / "sharded" / "statefulset.yaml").read_text())
    assert sts["kind"] == "StatefulSet" and sts["metadata"]["namespace"] == "monitoring"
    c = next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "kvwatch")
    env = {e["name"]: e for e in c["env"]}
    assert env["KVWATCH_SHARD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']")
    assert int(env["KVWATCH_SHARD_COUNT"]["value"]) == sts["spec"]["replicas"]
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["state"]
    assert c["args"] == ["run", "--config", "/etc/kvwatch/config.yaml"]
    kust = yaml.safe_load((K8S / "sharded" / "kustomization.yaml").read_text())
    assert kust["resources"] == ["../", "statefulset.yaml"]
    # what the pod's environment gives kvwatch for ordinal 1 of 2
    from kvwatch.config import load_settings

    s = load_settings(None, environ={"KVWATCH_SHARD_INDEX": "1", "KVWATCH_SHARD_COUNT": env["KVWATCH_SHARD_COUNT"]["value"]})
    assert (s.shard.index, s.shard.count) == (1, 2)
