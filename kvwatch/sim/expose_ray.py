"""Engines embedded in Ray Serve LLM: their own families re-exported by Ray's metrics agent.

vLLM's ``RayPrometheusStatLogger`` and SGLang's ``stat_loggers`` Ray wrappers turn every
``prometheus_client`` metric into a ``ray.util.metrics`` one: the name is sanitised for
OpenTelemetry (``vllm:x`` → ``vllm_x``), Ray's exporter prefixes ``ray_``, each series
gains Ray's tags (``ReplicaId`` from the wrapper; ``WorkerId``, ``Component``,
``SessionName`` from the agent), histogram bounds ≤ 0 are dropped (Ray rejects them)
and no ``_created`` series exist. Sources: ``vllm/v1/metrics/ray_wrappers.py``,
``sglang:python/sglang/srt/observability/ray_wrappers.py@18cc7bf2``.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Sequence

from kvwatch.sim.expose import Family, Labels, Sample, register
from kvwatch.sim.expose_sglang import render_0_5
from kvwatch.sim.expose_vllm import render_0_33
from kvwatch.sim.trace import EngineView
from kvwatch.sim.vocab import Dialect

_BAD = re.compile(r"[^a-zA-Z0-9_]")


def _ray_labels(model_name: str) -> Labels:
    h = zlib.crc32(model_name.encode())
    return (("Component", "core_worker"), ("ReplicaId", f"{h:08x}"), ("SessionName", "session_kvwatch_sim"),
            ("WorkerId", f"{h * 2654435761 % 2**32:08x}"))


def _keep(labels: Labels) -> bool:
    le = dict(labels).get("le")
    return le is None or le == "+Inf" or float(le) > 0


def rewrap(fams: Sequence[Family], model_name: str) -> list[Family]:
    """``fams`` as Ray's Prometheus endpoint shows them."""
    extra = _ray_labels(model_name)
    out = []
    for fam in fams:
        name = "ray_" + _BAD.sub("_", fam.name)
        samples = [Sample("ray_" + _BAD.sub("_", s.name), (*s.labels, *extra), s.value)
                   for s in fam.samples if _keep(s.labels)]
        out.append(Family(name, fam.kind, fam.help, samples, created=False))
    return out


def _ray(native: Callable[[Sequence[EngineView], str], list[Family]]
         ) -> Callable[[Sequence[EngineView], str], list[Family]]:
    return lambda views, model_name: rewrap(native(views, model_name), model_name)


register(Dialect.VLLM_RAY)(_ray(render_0_33))
register(Dialect.SGLANG_RAY)(_ray(render_0_5))
