"""Shared by the drivers (runs inside an engine venv: standard library + prometheus_client).

A timeline step (see conformance/timeline.py) carries ``state`` (gauges), ``delta``
(counter increments since the previous scrape) and ``obs`` (``[value, count]`` pairs per
quantity). ``expand`` turns pairs into the plain value lists the engines' stats objects
hold; ``finished`` pairs the per-request quantities into request records.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any


def load(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def expand(pairs: list[list[float]]) -> list[float]:
    out: list[float] = []
    for value, count in pairs:
        out.extend([float(value)] * int(count))
    return out


def finished(step: dict[str, Any]) -> list[dict[str, float]]:
    """One record per request finished in the interval (e2e observations), its other
    quantities paired in sorted order (only the marginals matter to histograms)."""
    obs = step["obs"]
    e2e = sorted(expand(obs["e2e"]))
    cols = {q: sorted(expand(obs[q])) for q in ("queue", "prompt_tokens", "gen_tokens",
                                               "tpot_req")}
    n = len(e2e)
    recs = []
    stop = round(step["delta"]["success_stop"])
    for i in range(n):
        rec = {"e2e": e2e[i], "reason": "stop" if i < stop else "length"}
        for q, vals in cols.items():
            rec[q] = vals[i] if i < len(vals) else (vals[-1] if vals else 0.0)
        recs.append(rec)
    return recs


def build(cls: type, values: dict[str, Any]) -> Any:
    """Instantiate dataclass ``cls`` from the ``values`` its fields name; required fields
    that ``values`` lacks get 0 (the stats classes change between versions)."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name in values:
            kwargs[f.name] = values[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = 0
    return cls(**kwargs)


class Writer:
    """JSON lines of scrapes."""

    def __init__(self, path: str) -> None:
        self._fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def scrape(self, t: float, text: bytes | str) -> None:
        body = text.decode("utf-8") if isinstance(text, bytes) else text
        self._fh.write(json.dumps({"t": t, "text": body}) + "\n")

    def close(self) -> None:
        self._fh.close()


def main_args() -> list[tuple[str, str]]:
    """``TIMELINE.json SCRAPES.jsonl`` pairs (several per process: the engine imports once)."""
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit(f"usage: {sys.argv[0]} TIMELINE.json SCRAPES.jsonl [TIMELINE.json SCRAPES.jsonl ...]")
    return list(zip(args[::2], args[1::2], strict=True))
