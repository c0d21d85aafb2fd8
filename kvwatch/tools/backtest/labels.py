"""Expected modes per target (ground truth) for scoring a backtest.

File format (YAML or JSON)::

    grace: 10m            # optional: an incident firing this long after an interval ends still counts
    targets:
      "pod-0:8000":       # instance, or "job/instance"
        - {from: 2026-11-29T10:15:00Z, to: 2026-11-29T10:45:00Z, mode: full}

The ``targets`` level may be omitted (top-level keys are then targets). Times
are RFC 3339 or Unix seconds; intervals are half-open ``[from, to)``. Outside
every interval a labelled target is expected to be ``healthy``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvwatch.config import read_yaml
from kvwatch.core.models import FailureMode
from kvwatch.durations import parse_duration, parse_time
from kvwatch.errors import ConfigError, Problem


@dataclass(frozen=True)
class Expected:
    """One expected interval ``[start, end)`` of ``mode`` (Unix seconds)."""

    start: float
    end: float
    mode: FailureMode

    def contains(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass(frozen=True)
class Labels:
    """Ground truth: target (instance or job/instance) → its expected intervals; ``grace_s`` in seconds."""

    targets: dict[str, tuple[Expected, ...]]
    grace_s: float = 0.0

    def for_target(self, job: str, instance: str) -> tuple[Expected, ...] | None:
        found = self.targets.get(f"{job}/{instance}")
        return found if found is not None else self.targets.get(instance)


def _time(value: Any, where: str, src: str) -> float:
    if isinstance(value, datetime):  # YAML parses unquoted RFC 3339 itself; naive means UTC
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    try:
        return parse_time(str(value)).timestamp()
    except ValueError as exc:
        raise ConfigError(Problem(src, where, str(exc))) from None


def parse_labels(doc: Mapping[str, Any], source: str = "labels") -> Labels:
    """Validate a parsed labels document; every problem names the file, target and interval."""
    problems: list[Problem] = []
    grace = 0.0
    if "grace" in doc:
        try:
            grace = parse_duration(doc["grace"])
        except ValueError as exc:
            problems.append(Problem(source, "grace", str(exc)))
    raw = doc.get("targets", {k: v for k, v in doc.items() if k != "grace"})
    if not isinstance(raw, Mapping):
        raise ConfigError(Problem(source, "targets", f"got {type(raw).__name__}, expected a mapping"))
    out: dict[str, tuple[Expected, ...]] = {}
    for name, items in raw.items():
        if not isinstance(items, list):
            problems.append(Problem(source, f"targets.{name}", "expected a list of {from, to, mode}"))
            continue
        got: list[Expected] = []
        for i, it in enumerate(items):
            where = f"targets.{name}[{i}]"
            if not isinstance(it, Mapping) or not {"from", "to", "mode"} <= set(it):
                problems.append(Problem(source, where, "expected keys from, to, mode"))
                continue
            try:
                mode = FailureMode(str(it["mode"]))
                start, end = _time(it["from"], f"{where}.from", source), _time(it["to"], f"{where}.to", source)
            except ValueError:
                problems.append(Problem(source, f"{where}.mode", f"got {it['mode']!r}, expected one of "
                                        + ", ".join(m.value for m in FailureMode)))
                continue
            except ConfigError as exc:
                problems.extend(exc.problems)
                continue
            if end <= start:
                problems.append(Problem(source, f"{where}.to", "must be after from"))
                continue
            got.append(Expected(start, end, mode))
        out[str(name)] = tuple(sorted(got, key=lambda e: e.start))
    if problems:
        raise ConfigError(problems)
    return Labels(out, grace)


def load_labels(path: Path) -> Labels:
    """Read a YAML or JSON labels file (JSON is YAML)."""
    return parse_labels(read_yaml(path), str(path))
