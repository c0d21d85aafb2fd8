"""docker-compose.yml, its Prometheus/Alertmanager/kvwatch configs and the Dockerfile.

There is no Docker engine here, so the stack is validated by parsing it and by
running the real ``promtool``/``amtool`` and ``kvwatch check`` on every file it mounts.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from support.prom import require_binary

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
SERVICES = {"simulator", "prometheus", "alertmanager", "grafana", "kvwatch"}
#: a pinned image tag: a version number, never `latest` or a bare name
PINNED = re.compile(r"^[\w./-]+:v?\d+\.\d+(\.\d+)?([\w.-]*)$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _bind_mounts(svc: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for v in svc.get("volumes", []):
        src, dst = v.split(":")[:2]
        if src.startswith((".", "/")):
            out.append((src, dst))
    return out


def _mount_source(compose: dict[str, Any], service: str, container_path: str) -> Path:
    for src, dst in _bind_mounts(compose["services"][service]):
        if dst == container_path:
            return (ROOT / src).resolve()
    raise AssertionError(f"{service}: nothing mounted at {container_path}")


def test_services_images_pinned_and_built_from_repo(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == SERVICES
    for name, svc in services.items():
        if "build" in svc:
            assert (ROOT / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file(), name
            continue
        image = svc["image"]
        assert PINNED.match(image), f"{name}: image {image!r} is not pinned to a version"
        assert not image.endswith(":latest")
    # the simulator and kvwatch run from the same image built from this repository
    assert services["simulator"]["image"] == services["kvwatch"]["image"]


def test_every_bind_mount_exists(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        for src, dst in _bind_mounts(svc):
            path = (ROOT / src).resolve()
            assert path.exists(), f"{name}: host path {src} (mounted at {dst}) does not exist"
            assert ROOT in path.parents, f"{name}: {src} points outside the repository"


def test_healthchecks_ports_and_volumes(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, svc in services.items():
        test = svc.get("healthcheck", {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL"), f"{name}: no healthcheck"
    ports = {name: [p.rsplit(":", 1)[-1] for p in svc.get("ports", [])] for name, svc in services.items()}
    assert ports["kvwatch"] == ["9877"] and ports["prometheus"] == ["9090"]
    assert ports["simulator"] == ["9400"] and ports["alertmanager"] == ["9093"] and ports["grafana"] == ["3000"]
    for svc in services.values():
        for p in svc.get("ports", []):
            assert p.startswith("127.0.0.1:"), f"{p}: published beyond loopback"
    assert "/healthz" in " ".join(services["kvwatch"]["healthcheck"]["test"])
    named = set(compose["volumes"])
    assert {"kvwatch-state", "prometheus-data"} <= named

    def volume_at(service: str, path: str) -> str:
        for v in services[service]["volumes"]:
            src, dst = v.split(":")[:2]
            if dst == path:
                return src
        raise AssertionError(f"{service}: no volume at {path}")

    assert volume_at("kvwatch", "/var/lib/kvwatch") == "kvwatch-state"
    assert volume_at("prometheus", "/prometheus") == "prometheus-data"
    assert services["kvwatch"]["environment"]["KVWATCH_STATE_PATH"].startswith("/var/lib/kvwatch/")


def test_slack_settings_come_from_the_environment(compose: dict[str, Any]) -> None:
    env = compose["services"]["kvwatch"]["environment"]
    for var in ("SLACK_BOT_TOKEN", "SLACK_CHANNEL", "SLACK_WEBHOOK_URL"):
        # interpolated from the host environment, empty (console output) by default
        assert env[var] == "${" + var + ":-}", env[var]
    assert "xox" not in COMPOSE.read_text()


def test_commands_parse_with_the_real_cli(compose: dict[str, Any]) -> None:
    from kvwatch.cli import build_parser

    parser = build_parser()
    for name in ("simulator", "kvwatch"):
        cmd = compose["services"][name]["command"]
        args = parser.parse_args(cmd)
        assert callable(args.func), f"{name}: {shlex.join(cmd)} has no handler"
    sim = compose["services"]["simulator"]["command"]
    assert sim[:2] == ["simulate", "serve"] and "--presets" in sim and "0.0.0.0" in sim
    kv = compose["services"]["kvwatch"]["command"]
    assert kv == ["run", "--config", "/etc/kvwatch/config.yaml"]


def test_prometheus_config_targets_the_compose_services(compose: dict[str, Any]) -> None:
    cfg = yaml.safe_load(_mount_source(compose, "prometheus", "/etc/prometheus/prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    sd = urlparse(jobs["simulator"]["http_sd_configs"][0]["url"])
    assert (sd.hostname, sd.port, sd.path) == ("simulator", 9400, "/sd")
    assert jobs["kvwatch"]["static_configs"][0]["targets"] == ["kvwatch:9877"]
    # issue 17 item 16: kvwatch's per-target series keep the engine's job/instance (dashboards filter on them)
    assert jobs["kvwatch"].get("honor_labels") is True
    am = cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert am == ["alertmanager:9093"]


def test_prometheus_config_passes_promtool_with_the_native_rules(compose: dict[str, Any], tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    src = _mount_source(compose, "prometheus", "/etc/prometheus/prometheus.yml")
    rules_dir = _mount_source(compose, "prometheus", "/etc/prometheus/rules")
    res = subprocess.run([promtool, "check", "config", str(src)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    # again with rule_files pointing at the mounted host directory, so promtool
    # also checks the native rules Prometheus would load in the container
    cfg = yaml.safe_load(src.read_text())
    cfg["rule_files"] = [str(rules_dir / Path(p).name) for p in cfg["rule_files"]]
    local = tmp_path / "prometheus.yml"
    local.write_text(yaml.safe_dump(cfg))
    res = subprocess.run([promtool, "check", "config", str(local)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_alertmanager_config_passes_amtool(compose: dict[str, Any]) -> None:
    amtool = require_binary("amtool")
    src = _mount_source(compose, "alertmanager", "/etc/alertmanager/alertmanager.yml")
    res = subprocess.run([amtool, "check-config", str(src)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_kvwatch_config_passes_check_and_points_at_services(compose: dict[str, Any]) -> None:
    src = _mount_source(compose, "kvwatch", "/etc/kvwatch/config.yaml")
    exe = shutil.which("kvwatch") or sys.executable
    cmd = [exe] if exe.endswith("kvwatch") else [exe, "-m", "kvwatch.cli"]
    res = subprocess.run([*cmd, "check", "--config", str(src)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    from kvwatch.config import load_settings

    s = load_settings(src, environ={})
    assert urlparse(s.prometheus.url).hostname in SERVICES
    assert all(urlparse(u).hostname in SERVICES for u in s.alertmanager.urls)
    assert s.server.port == 9877 and s.server.host == "0.0.0.0"
    assert s.state.path.startswith("/var/lib/kvwatch/")
    assert not s.slack.enabled  # secrets only from the environment


def test_grafana_provisioning_is_mounted(compose: dict[str, Any]) -> None:
    ds_dir = _mount_source(compose, "grafana", "/etc/grafana/provisioning/datasources")
    dash_dir = _mount_source(compose, "grafana", "/etc/grafana/provisioning/dashboards")
    assert any(ds_dir.glob("*.y*ml")), f"no datasource provisioning in {ds_dir}"
    providers = [yaml.safe_load(f.read_text()) for f in dash_dir.glob("*.y*ml")]
    assert providers, f"no dashboard provider in {dash_dir}"
    # the provider's path must be where compose mounts dashboards/
    mounted = {dst for src, dst in _bind_mounts(compose["services"]["grafana"])
               if (ROOT / src).resolve() == (ROOT / "dashboards").resolve()}
    paths = {p["options"]["path"] for doc in providers for p in doc.get("providers", [])}
    assert any(any(path == m or path.startswith(m + "/") for m in mounted) for path in paths), (paths, mounted)
    assert any(json.loads(f.read_text()).get("uid") for f in (ROOT / "dashboards").rglob("*.json"))


# ----------------------------------------------------------------- Dockerfile


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_dockerfile_runtime_stage() -> None:
    ins = _instructions(ROOT / "Dockerfile")
    froms = [rest.split()[0] for op, rest in ins if op == "FROM"]
    assert froms and all(re.match(r"^python:3\.11\.\d+-slim", f) for f in froms), froms
    last = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    final = ins[last:]
    users = [rest for op, rest in final if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    ops = {op: rest for op, rest in final}
    assert json.loads(ops["ENTRYPOINT"]) == ["kvwatch"]
    assert json.loads(ops["CMD"]) == ["run", "--config", "/etc/kvwatch/config.yaml"]
    assert "9877" in ops["EXPOSE"].split()
    assert "/healthz" in ops["HEALTHCHECK"] and "9877" in ops["HEALTHCHECK"]
    assert "/var/lib/kvwatch" in ops["VOLUME"]
    assert "KVWATCH_STATE_PATH=/var/lib/kvwatch/state.db" in ops["ENV"]


def test_dockerfile_copies_exist_and_are_not_ignored() -> None:
    ignored = {
        line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for op, rest in _instructions(ROOT / "Dockerfile"):
        if op != "COPY" or rest.startswith("--from"):
            continue
        for src in rest.split()[:-1]:
            assert (ROOT / src).exists(), f"COPY {src}: missing"
            assert src.rstrip("/") not in ignored, f"COPY {src}: excluded by .dockerignore"
    # the build context stays small: tests and VCS data never go in
    assert {".git", "tests"} <= ignored
