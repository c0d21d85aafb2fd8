"""Issue 13 items 5 and 7 against a real Prometheus serving TLS with a private CA.

One Prometheus requires basic auth over TLS; a second requires a client certificate (mTLS).
``verify_tls`` (file and environment), a CA bundle, a client certificate and credentials in
the URL must all take effect, and the credentials never appear in what kvwatch prints.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.tls import Certs, bcrypt_hash, make_certs, prometheus_web

from kvwatch.cli import main
from kvwatch.config import load_settings
from kvwatch.core.promclient import PromClient
from kvwatch.errors import PrometheusUnreachable

pytestmark = pytest.mark.prometheus

USER, PASSWORD = "kvwatch", "pr0m-S3cret-pass"
NOW = datetime.now(tz=UTC)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_prom(certs: Certs) -> Iterator[str]:
    """TLS with the private CA's server certificate, and basic auth."""
    web = (f"tls_server_config:\n  cert_file: {certs.server_cert}\n  key_file: {certs.server_key}\n"
           f"basic_auth_users:\n  {USER}: '{bcrypt_hash(PASSWORD)}'\n")
    with prometheus_web(web, ready={"verify": str(certs.ca), "auth": (USER, PASSWORD)}) as url:
        yield url


@pytest.fixture(scope="module")
def mtls_prom(certs: Certs) -> Iterator[str]:
    """TLS that requires a client certificate signed by the private CA."""
    web = (f"tls_server_config:\n  cert_file: {certs.server_cert}\n  key_file: {certs.server_key}\n"
           f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {certs.ca}\n")
    ready = {"verify": str(certs.ca), "cert": (str(certs.client_cert), str(certs.client_key))}
    with prometheus_web(web, ready=ready) as url:
        yield url


def with_creds(url: str) -> str:
    return url.replace("https://", f"https://{USER}:{PASSWORD}@")


def client(url: str, environ: dict[str, str] | None = None, **prom: object) -> PromClient:
    s = load_settings(None, environ=environ or {}, overrides={"prometheus": {"url": url, "retries": 0, **prom}})
    return PromClient.from_settings(s.prometheus)


def test_verify_on_refuses_the_self_signed_server(tls_prom: str) -> None:
    with pytest.raises(PrometheusUnreachable) as err:
        client(with_creds(tls_prom)).instant("up", NOW)
    assert "CERTIFICATE_VERIFY_FAILED" in str(err.value) or "certificate" in str(err.value).lower()
    assert PASSWORD not in str(err.value) and tls_prom in str(err.value)


def test_verify_off_in_the_file_works(tls_prom: str, tmp_path: Path) -> None:
    cfg = tmp_path / "kvwatch.yaml"
    cfg.write_text(f"prometheus:\n  url: {with_creds(tls_prom)}\n  verify_tls: false\n")
    s = load_settings(cfg, environ={})
    assert PromClient.from_settings(s.prometheus).instant("vector(1)", NOW)[0]["value"][1] == "1"


def test_verify_off_in_the_environment_works(tls_prom: str) -> None:
    c = client(with_creds(tls_prom), environ={"KVWATCH_PROMETHEUS_VERIFY_TLS": "false"})
    assert c.instant("vector(1)", NOW)[0]["value"][1] == "1"


def test_ca_bundle_works_and_credentials_go_as_basic_auth(tls_prom: str, certs: Certs) -> None:
    assert client(with_creds(tls_prom), ca_file=str(certs.ca)).instant("vector(2)", NOW)[0]["value"][1] == "2"
    # without the URL's credentials Prometheus answers 401: they really were sent
    with pytest.raises(Exception) as err:
        client(tls_prom, ca_file=str(certs.ca)).instant("vector(2)", NOW)
    assert "401" in str(err.value)


def test_client_certificate_mtls(mtls_prom: str, certs: Certs) -> None:
    with pytest.raises(PrometheusUnreachable):
        client(mtls_prom, ca_file=str(certs.ca)).instant("vector(3)", NOW)
    c = client(mtls_prom, ca_file=str(certs.ca), cert_file=str(certs.client_cert), key_file=str(certs.client_key))
    assert c.instant("vector(3)", NOW)[0]["value"][1] == "3"


def test_cli_once_over_tls_and_missing_files_are_config_errors(
    tls_prom: str, certs: Certs, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for k in [k for k in os.environ if k.startswith(("KVWATCH_", "SLACK_"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("KVWATCH_PROMETHEUS_CA_FILE", str(certs.ca))
    assert main(["once", "--prometheus-url", with_creds(tls_prom), "--format", "json"]) == 0
    out = capsys.readouterr()
    assert PASSWORD not in out.out + out.err
    monkeypatch.setenv("KVWATCH_PROMETHEUS_CA_FILE", str(tmp_path / "nope.pem"))
    assert main(["once", "--prometheus-url", with_creds(tls_prom)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "prometheus.ca_file" in err[0] and "environment" in err[0], err
    assert PASSWORD not in err[0]


def test_capacity_reads_prometheus_with_the_same_tls_settings(
    tls_prom: str, certs: Certs, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kvwatch capacity --prometheus-url` builds its client from the `prometheus` section
    too (environment and --config), not from the bare URL: a CA bundle and verify_tls apply."""
    for k in [k for k in os.environ if k.startswith(("KVWATCH_", "SLACK_"))]:
        monkeypatch.delenv(k)
    model = ["capacity", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--kv-dtype", "bf16",
             "--max-input", "4k", "--max-output", "1k", "--format", "json", "--prometheus-url", with_creds(tls_prom)]
    assert main(model) == 3  # verify on, private CA unknown: refused
    err = capsys.readouterr().err
    assert "certificate" in err.lower() and PASSWORD not in err
    monkeypatch.setenv("KVWATCH_PROMETHEUS_CA_FILE", str(certs.ca))
    assert main(model) == 0
    capsys.readouterr()
    monkeypatch.delenv("KVWATCH_PROMETHEUS_CA_FILE")
    cfg = tmp_path / "kvwatch.yaml"
    cfg.write_text("prometheus:\n  verify_tls: false\n")
    assert main([*model, "--config", str(cfg)]) == 0
    out = capsys.readouterr()
    assert PASSWORD not in out.out + out.err
