"""Safe rendering of rule templates: missing numbers print as ``n/a``, never crash."""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Mapping
from typing import Any


class Num:
    """A number that may be unknown or only a lower bound; formats with any numeric spec,
    ``None`` → ``n/a``, a lower bound → ``> 30.00``."""

    __slots__ = ("lower", "value")

    def __init__(self, value: float | None, lower: bool = False) -> None:
        self.value = value
        #: only a lower bound (a quantile past the last histogram bucket): renders "> 30.00"
        self.lower = lower

    def __format__(self, spec: str) -> str:
        if self.value is None:
            return "n/a"
        try:
            text = format(self.value, spec)
        except (ValueError, TypeError):
            text = format(self.value, "g")
        return f"> {text.strip()}" if self.lower else text

    def __str__(self) -> str:
        return self.__format__("g")


Piece = tuple[str, tuple[str, ...] | None, str]


@functools.lru_cache(maxsize=1024)
def compile_template(template: str) -> tuple[Piece, ...]:
    """Split a template once into (literal, field path, format spec) pieces.

    Raises ``ValueError`` on malformed braces (rule loading reports it).
    """
    pieces: list[Piece] = []
    for literal, field, spec, _conv in string.Formatter().parse(template):
        path = tuple(field.split(".")) if field else None
        pieces.append((literal, path, spec or ""))
    return tuple(pieces)


@functools.lru_cache(maxsize=1024)
def _unsafe(path: tuple[str, ...]) -> bool:
    # rule loading checks the grammar (kvwatch.core.rules.check_template); this is the second
    # line: a dunder or item path never reaches getattr, so no template can walk into internals
    return any(not p or p.startswith("_") or not p.isidentifier() for p in path)


def _resolve(ctx: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    if _unsafe(path):
        return Num(None)
    try:
        obj = ctx[path[0]]
        for attr in path[1:]:
            obj = getattr(obj, attr)
    except (AttributeError, KeyError, IndexError):
        return Num(None)
    return obj
# a unit glued to an unknown number ("n/as", "n/a/s") reads as noise
_NA_UNIT = re.compile(r"n/a(?:/s|s|%|×)(?=\W|$)")


# an optional segment: dropped whole when any number in it is unknown
_OPTIONAL = re.compile(r"\[\[(.*?)\]\]")


def render(template: str, ctx: Mapping[str, Any]) -> str:
    """Format ``template`` against ``ctx``; unknown values render as ``n/a``.

    Text inside ``[[ ... ]]`` is optional: it is kept (without the brackets) only
    when every number in it is known, so triage never reads "queue p99 n/a".
    """
    out: list[str] = []
    for literal, path, spec in compile_template(template):
        out.append(literal)
        if path is not None:
            out.append(format(_resolve(ctx, path), spec))
    return _tidy("".join(out))


@functools.lru_cache(maxsize=4096)
def _tidy(raw: str) -> str:
    """Whitespace, ``n/a`` units and optional segments of a formatted template (memoised:
    a fleet's triage repeats the same text for many targets)."""
    text = " ".join(raw.split())
    text = _NA_UNIT.sub("n/a", text)
    text = _OPTIONAL.sub(lambda m: "" if "n/a" in m.group(1) else m.group(1), text)
    return " ".join(text.split()).replace(" ,", ",").replace(" ;", ";").replace(" .", ".")
