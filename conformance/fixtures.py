"""Conformance fixtures: provenance headers and the fingerprint of the dialects reading them.

Every fixture starts with ``# key: value`` lines (engine, version, scenario, the command
that made it, the fingerprint of the kvwatch dialect-table entries that read it). A
``.prom`` snapshot keeps them (comments are legal in the text format); an OpenMetrics
series (``.om`` / ``.om.gz``) must lose them before promtool reads it, because
OpenMetrics allows no free comments: :func:`openmetrics_body` does that.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from kvwatch.core.dialects import DIALECT_BY_ID

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "conformance"
HEADER_PREFIX = "# "


def dialect_fingerprint(dialect_ids: list[str] | tuple[str, ...]) -> str:
    """Hash (12 hex) of what the named dialect entries read from an exposition: their
    markers and, per signal, each source's kind, metric, label matchers and required
    names. A new or renamed metric or label changes it; an aggregation or estimate text
    does not (the fixture's content cannot depend on those)."""
    doc = []
    for did in sorted(dialect_ids):
        d = DIALECT_BY_ID[did]
        sources = {
            sig.value: [(s.kind.value, s.metric, s.matchers, list(s.requires)) for s in srcs]
            for sig, srcs in sorted(d.sources.items(), key=lambda kv: kv[0].value)
        }
        doc.append({"id": d.id, "engine": d.engine, "markers": list(d.markers),
                    "required_label": d.required_label, "sources": sources})
    blob = json.dumps(doc, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _open_text(path: Path) -> str:
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode("utf-8")
    return path.read_text(encoding="utf-8")


def split(path: str | Path) -> tuple[dict[str, str], str]:
    """(header fields, body) of a fixture; the body starts at the first non-header line."""
    text = _open_text(Path(path))
    header: dict[str, str] = {}
    pos = 0
    for line in text.splitlines(keepends=True):
        stripped = line.rstrip("\n")
        key, sep, value = stripped.removeprefix(HEADER_PREFIX).partition(": ")
        if not (stripped.startswith(HEADER_PREFIX) and sep and key.isidentifier()):
            break
        header[key] = value
        pos += len(line)
    if not header:
        raise ValueError(f"{path}: no provenance header (# key: value lines)")
    return header, text[pos:]


def header(path: str | Path) -> dict[str, str]:
    return split(path)[0]


def openmetrics_body(path: str | Path) -> str:
    """The OpenMetrics text of a series fixture, ready for promtool."""
    _, body = split(path)
    if not body.rstrip().endswith("# EOF"):
        raise ValueError(f"{path}: OpenMetrics body does not end with # EOF")
    return body


def header_lines(fields: dict[str, str]) -> list[str]:
    """``key: value`` lines (without the comment mark) in the given order."""
    for k, v in fields.items():
        if not k.isidentifier() or "\n" in v:
            raise ValueError(f"bad header field {k!r}")
    return [f"{k}: {v}" for k, v in fields.items()]


def fixtures() -> list[Path]:
    """Every committed conformance fixture."""
    return sorted(p for p in FIXTURES.glob("*") if p.name.endswith((".prom", ".om", ".om.gz")))
