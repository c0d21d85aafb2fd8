"""Units for capacity planning: byte sizes, token counts, and their human rendering.

Sizes are parsed to whole bytes (``int``): binary suffixes (``KiB`` … ``TiB``) are
powers of 1024, decimal suffixes (``KB`` … ``TB``) powers of 1000, a bare number
is bytes. Token counts accept ``k``/``K`` = 1024 and ``m``/``M`` = 1024² because
context lengths are quoted that way (``32k`` = 32768, ``128K`` = 131072).
Every parse error is a :class:`CapacityError` whose message is one line that
names the field.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from kvwatch.errors import KvwatchError

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

SIZE_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": KIB,
    "mib": MIB,
    "gib": GIB,
    "tib": TIB,
}
TOKEN_UNITS: dict[str, int] = {"": 1, "k": 1024, "m": 1024**2}

_NUMBER = re.compile(r"^\s*(?P<num>[+-]?\d+(?:\.\d+)?)\s*(?P<unit>[A-Za-z]*)\s*$")


class CapacityError(KvwatchError, ValueError):
    """Bad capacity input. ``str(err)`` is one line naming the field (a flag or a config key)."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


def _split(text: str, field: str, what: str) -> tuple[Decimal, str]:
    match = _NUMBER.match(str(text))
    if not match:
        raise CapacityError(f"{field}: expected {what}, got {text!r}")
    try:
        number = Decimal(match["num"])
    except InvalidOperation:  # pragma: no cover - the regex only lets decimals through
        raise CapacityError(f"{field}: expected {what}, got {text!r}") from None
    if number <= 0:
        raise CapacityError(f"{field}: must be greater than 0, got {text!r}")
    return number, match["unit"]


def parse_size(text: str | int, field: str = "size") -> int:
    """Parse ``80GiB``, ``500MiB``, ``40GB`` (decimal) or plain bytes to bytes (> 0).

    Fractions are allowed (``1.5GiB``); a fractional byte count is rounded down.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    number, unit = _split(str(text), field, "a size such as 80GiB, 500MiB, 40GB or bytes")
    factor = SIZE_UNITS.get(unit.lower() or "b")
    if factor is None:
        units = ", ".join(("B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"))
        raise CapacityError(f"{field}: unknown unit {unit!r} in {text!r} (expected one of {units})")
    value = int(number * factor)
    if value <= 0:
        raise CapacityError(f"{field}: must be at least 1 byte, got {text!r}")
    return value


def parse_tokens(text: str | int, field: str = "tokens") -> int:
    """Parse a token count: ``32768``, ``32k`` (= 32768), ``128K`` (= 131072), ``1M``.

    The result must be a whole number of tokens greater than 0.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    number, unit = _split(str(text), field, "a token count such as 32768, 32k or 128K")
    factor = TOKEN_UNITS.get(unit.lower())
    if factor is None:
        raise CapacityError(f"{field}: unknown suffix {unit!r} in {text!r} (expected k or M)")
    value = number * factor
    if value != value.to_integral_value():
        raise CapacityError(f"{field}: not a whole number of tokens: {text!r}")
    return int(value)


def parse_positive_int(text: str | int, field: str) -> int:
    """Parse a plain integer greater than 0 (layers, heads, GPUs, concurrency)."""
    value = str(text).strip()
    if not re.fullmatch(r"[+-]?\d+", value):
        raise CapacityError(f"{field}: expected a whole number, got {text!r}")
    if int(value) <= 0:
        raise CapacityError(f"{field}: must be greater than 0, got {text!r}")
    return int(value)


def parse_fraction(text: str | float, field: str) -> float:
    """Parse a fraction in (0, 1], e.g. the GPU memory utilization ``0.9``."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise CapacityError(f"{field}: expected a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise CapacityError(f"{field}: must be in (0, 1], got {text!r}")
    return value


def format_bytes(n: int) -> str:
    """Human binary size with at most two decimals: ``128 KiB``, ``4.25 GiB``, ``512 B``."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, factor in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= factor:
            text = f"{n / factor:.2f}".rstrip("0").rstrip(".")
            return f"{sign}{text} {unit}"
    return f"{sign}{n} B"


def format_exact(n: int) -> str:
    """Human size followed by the exact byte count: ``128 KiB (131,072 B)``."""
    return f"{format_bytes(n)} ({n:,} B)"
