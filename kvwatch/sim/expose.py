"""Prometheus exposition of simulated engines in each dialect's real metric names.

Dialect renderers turn engine views into ``Family`` objects; values are scalars (one
instant, live server) or arrays over scrape times (backfill). ``render_text`` writes the
text format 0.0.4 that the engines serve.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from prometheus_client.utils import floatToGoString

from kvwatch.sim.trace import EngineView, Value
from kvwatch.sim.vocab import Dialect

Kind = Literal["counter", "gauge", "histogram"]
Labels = tuple[tuple[str, str], ...]
CONTENT_TYPE_004 = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Labels
    value: Value


@dataclass
class Family:
    """One metric family. ``name`` is as in the engine's ``# TYPE`` line (counters: the
    exposed sample name, usually ending in ``_total``)."""

    name: str
    kind: Kind
    help: str
    samples: list[Sample] = field(default_factory=list)
    created: bool = False  # prometheus_client single-process mode adds ``*_created``


class Families:
    """Ordered builder of families; adding to an existing name appends samples."""

    def __init__(self, created: bool = False) -> None:
        self._by_name: dict[str, Family] = {}
        self._created = created

    def _family(self, name: str, kind: Kind, help_: str) -> Family:
        fam = self._by_name.get(name)
        if fam is None:
            fam = self._by_name[name] = Family(name, kind, help_,
                                               created=self._created and kind != "gauge")
        return fam

    def gauge(self, name: str, help_: str, labels: Labels, value: Value) -> None:
        self._family(name, "gauge", help_).samples.append(Sample(name, labels, value))

    def counter(self, name: str, help_: str, labels: Labels, value: Value) -> None:
        self._family(name, "counter", help_).samples.append(Sample(name, labels, value))

    def histogram(self, name: str, help_: str, labels: Labels, view: EngineView,
                  quantity: str, bounds: Sequence[float]) -> None:
        fam = self._family(name, "histogram", help_)
        cum, count, total = view.hist(quantity, bounds)
        for le, value in zip((*map(floatToGoString, bounds), "+Inf"), cum, strict=True):
            fam.samples.append(Sample(f"{name}_bucket", (*labels, ("le", le)), value))
        fam.samples.append(Sample(f"{name}_count", labels, count))
        fam.samples.append(Sample(f"{name}_sum", labels, total))

    def done(self) -> list[Family]:
        return list(self._by_name.values())


Renderer = Callable[[Sequence[EngineView], str], list[Family]]
_RENDERERS: dict[Dialect, Renderer] = {}


def register(*dialects: Dialect) -> Callable[[Renderer], Renderer]:
    def deco(fn: Renderer) -> Renderer:
        for d in dialects:
            _RENDERERS[d] = fn
        return fn

    return deco


def families(dialect: Dialect | str, views: Sequence[EngineView], model_name: str
             ) -> list[Family]:
    """Families of ``dialect`` for one instance (several views: data-parallel engines)."""
    from kvwatch.sim import (  # noqa: F401  (register)
        expose_dynamo,
        expose_lmdeploy,
        expose_ray,
        expose_sglang,
        expose_tgi,
        expose_trtllm,
        expose_vllm,
    )

    return _RENDERERS[Dialect(dialect)](views, model_name)


def escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def label_text(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels) + "}"


def _scalar(value: Value) -> float:
    return float(np.asarray(value).reshape(-1)[-1])


def render_text(fams: Iterable[Family], created_at: float | None = None) -> str:
    """Text exposition format 0.0.4 (last value of array-valued samples)."""
    out: list[str] = []
    for fam in fams:
        help_ = fam.help.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {fam.name} {help_}\n# TYPE {fam.name} {fam.kind}\n")
        out.extend(f"{s.name}{label_text(s.labels)} {floatToGoString(_scalar(s.value))}\n"
                   for s in fam.samples)
        if fam.created and created_at is not None:
            base = fam.name.removesuffix("_total")
            out.append(f"# HELP {base}_created {help_}\n# TYPE {base}_created gauge\n")
            seen = dict.fromkeys(tuple(kv for kv in s.labels if kv[0] != "le")
                                 for s in fam.samples)
            out.extend(f"{base}_created{label_text(lb)} {floatToGoString(created_at)}\n"
                       for lb in seen)
    return "".join(out)


def exposition(dialect: Dialect | str, views: Sequence[EngineView], model_name: str,
               created_at: float | None = None) -> str:
    """What ``/metrics`` of this engine instance would return now."""
    return render_text(families(dialect, views, model_name), created_at)
