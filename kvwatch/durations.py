"""Prometheus-style durations (``30s``, ``5m``, ``1h30m``, ``2d``) ↔ seconds."""

from __future__ import annotations

import re
from datetime import UTC, datetime

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str | float | int) -> float:
    """Seconds in a duration. Plain numbers are seconds. Raises ``ValueError`` on anything else."""
    if isinstance(text, bool):
        raise ValueError(f"expected a duration like 30s, 5m, 1h; got {text!r}")
    if isinstance(text, int | float):
        if text < 0:
            raise ValueError(f"duration must not be negative, got {text!r}")
        return float(text)
    s = str(text).strip()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return float(s)
    pos, total = 0, 0.0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError(f"expected a duration like 30s, 5m, 1h; got {text!r}")
    return total


def format_duration(seconds: float) -> str:
    """Compact form for PromQL and messages: 90 → '1m30s', 0.5 → '500ms'."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    out, rest = "", round(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            out += f"{rest // size}{unit}"
            rest %= size
    return out or "0s"


def parse_time(text: str) -> datetime:
    """RFC 3339 (``2026-11-29T10:00:00Z``) or a Unix timestamp → aware UTC datetime."""
    s = text.strip()
    try:
        return datetime.fromtimestamp(float(s), tz=UTC)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"expected an RFC 3339 time like 2026-11-29T10:00:00Z, got {text!r}") from None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)
