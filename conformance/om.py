"""Scrapes of a real exporter (text format 0.0.4) → OpenMetrics with timestamps.

A driver records what ``prometheus_client.generate_latest()`` returned at each scrape
instant; this module stitches those scrapes into one OpenMetrics document in the layout
the simulator's writer uses (families contiguous and declared once, ``job`` and
``instance`` on every sample, ``# EOF`` last) so that ``promtool tsdb
create-blocks-from openmetrics`` ingests it. Series are kept exactly as a Prometheus
scraping the text format stores them: ``*_created`` samples stay their own series.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Scrape:
    """One ``/metrics`` body and the instant it was taken (epoch s)."""

    t: float
    text: str


def read_scrapes(path: str | Path) -> list[Scrape]:
    """A driver's JSON-lines output: one ``{"t": epoch_s, "text": body}`` per line."""
    out = []
    with Path(path).open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            try:
                doc = json.loads(line)
                out.append(Scrape(float(doc["t"]), str(doc["text"])))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: not a scrape line ({exc})") from exc
    return out


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(labels: Labels) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}" if labels else ""


def _stamp(t: float) -> str:
    t = round(t, 3)
    return str(int(t)) if t == int(t) else f"{t:.3f}"


def _value(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


@dataclass
class _Family:
    kind: str
    help: str
    # series key (sample name, labels) → [(stamp, value)], in first-seen order
    series: dict[tuple[str, Labels], list[tuple[str, str]]]


def _om_kind(kind: str) -> str:
    return kind if kind in ("counter", "gauge", "histogram", "summary", "info") else "unknown"


def collect(scrapes: Iterable[Scrape], target: Labels) -> dict[str, _Family]:
    """Families of every scrape, merged by name, samples labelled with ``target``."""
    fams: dict[str, _Family] = {}
    for scrape in scrapes:
        ts = _stamp(scrape.t)
        for mf in text_string_to_metric_families(scrape.text):
            fam = fams.setdefault(mf.name, _Family(mf.type, mf.documentation, {}))
            for s in mf.samples:
                labels = (*target, *sorted(s.labels.items()))
                fam.series.setdefault((s.name, labels), []).append((ts, _value(s.value)))
    return fams


def _lines(name: str, fam: _Family) -> Iterator[str]:
    yield f"# TYPE {name} {_om_kind(fam.kind)}\n# HELP {name} {_escape(fam.help)}\n"
    if fam.kind != "histogram":
        for (sname, labels), points in fam.series.items():
            prefix = f"{sname}{_labels(labels)} "
            yield from (f"{prefix}{v} {t}\n" for t, v in points)
        return
    # a histogram's points at one instant must be written together (buckets, count, sum)
    groups: dict[Labels, list[tuple[str, list[tuple[str, str]]]]] = {}
    for (sname, labels), points in fam.series.items():
        key = tuple(kv for kv in labels if kv[0] != "le")
        groups.setdefault(key, []).append((f"{sname}{_labels(labels)} ", points))
    for cols in groups.values():
        stamps = sorted({t for _, pts in cols for t, _ in pts}, key=float)
        by_t = [dict(pts) for _, pts in cols]
        for t in stamps:
            yield from (f"{prefix}{pts[t]} {t}\n" for (prefix, _), pts in zip(cols, by_t,
                                                                             strict=True)
                        if t in pts)


def write(targets: dict[Labels, list[Scrape]], path: str | Path, header: Iterable[str] = ()
          ) -> int:
    """Write every target's scrapes to ``path``; returns the number of samples.

    ``header`` lines are written first as ``# ...`` comments (fixture provenance);
    promtool ignores them.
    """
    merged: dict[str, list[_Family]] = {}
    for target, scrapes in targets.items():
        for name, fam in collect(scrapes, target).items():
            merged.setdefault(name, []).append(fam)
    n = 0
    with Path(path).open("w", encoding="utf-8") as out:
        for line in header:
            out.write(f"# {line}\n")
        for name, fams in merged.items():
            first = True
            for fam in fams:
                for text in _lines(name, fam):
                    if text.startswith("# TYPE"):
                        if not first:
                            continue
                        first = False
                    else:
                        n += 1
                    out.write(text)
        out.write("# EOF\n")
    return n
