"""A private CA, server and client certificates, and a real Prometheus serving TLS / mTLS / basic auth.

Certificates come from the ``cryptography`` package (a test dependency of kvwatch
through ``requests``/``urllib3`` wheels); bcrypt hashes for Prometheus'
``basic_auth_users`` from the standard library's ``crypt`` (libxcrypt ``$2b$``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from support.prom import PROMETHEUS, on_free_ports, require_binary, server_process


@dataclass(frozen=True)
class Certs:
    dir: Path
    ca: Path  # CA certificate (the bundle a client trusts)
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None = None) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        path.with_suffix(".key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def make_certs(where: Path) -> Certs:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, all signed by the CA."""
    now = dt.datetime.now(dt.UTC)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kvwatch test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(hours=1))
          .not_valid_after(now + dt.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))

    def leaf(cn: str, usage: x509.ObjectIdentifier, san: list[x509.GeneralName] | None) -> tuple:
        key = _key()
        b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
             .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return b.sign(ca_key, hashes.SHA256()), key

    server, server_key = leaf("127.0.0.1", ExtendedKeyUsageOID.SERVER_AUTH,
                              [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    client, client_key = leaf("kvwatch", ExtendedKeyUsageOID.CLIENT_AUTH, None)
    where.mkdir(parents=True, exist_ok=True)
    _write(where / "ca.pem", ca)
    _write(where / "server.pem", server, server_key)
    _write(where / "client.pem", client, client_key)
    return Certs(where, where / "ca.pem", where / "server.pem", where / "server.key",
                 where / "client.pem", where / "client.key")


def bcrypt_hash(password: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

        return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))


@contextmanager
def prometheus_web(web_config: str, *, tsdb: Path | None = None, ready: dict | None = None) -> Iterator[str]:
    """A real Prometheus with ``--web.config.file``; yields ``https://127.0.0.1:PORT``.

    ``ready``: keyword arguments for ``requests.get`` that pass the server's TLS/auth
    (verify, cert, auth) so the readiness probe gets through.
    """
    binary = require_binary(PROMETHEUS)
    work = Path(tempfile.mkdtemp(prefix="kvwatch-promtls-"))
    (work / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\n")
    (work / "web.yml").write_text(web_config)

    @contextmanager
    def start(ports: list[int]) -> Iterator[str]:
        url = f"https://127.0.0.1:{ports[0]}"
        args = [binary, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={tsdb or work / 'data'}",
                f"--web.listen-address=127.0.0.1:{ports[0]}", f"--web.config.file={work / 'web.yml'}",
                "--storage.tsdb.retention.time=100y"]
        with server_process(args, f"{url}/-/ready", work / "prometheus.log", timeout=30, **(ready or {})):
            yield url

    try:
        with on_free_ports(start) as url:
            yield url
    finally:
        shutil.rmtree(work, ignore_errors=True)
