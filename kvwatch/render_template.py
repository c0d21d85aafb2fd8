"""Safe rendering of rule templates: missing numbers print as ``n/a``, never crash."""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import Any


class Num:
    """A number that may be unknown; formats with any numeric spec, ``None`` → ``n/a``."""

    __slots__ = ("value",)

    def __init__(self, value: float | None) -> None:
        self.value = value

    def __format__(self, spec: str) -> str:
        if self.value is None:
            return "n/a"
        try:
            return format(self.value, spec)
        except (ValueError, TypeError):
            return format(self.value, "g")

    def __str__(self) -> str:
        return self.__format__("g")


class _Formatter(string.Formatter):
    def get_field(self, field_name: str, args: Any, kwargs: Any) -> Any:
        try:
            return super().get_field(field_name, args, kwargs)
        except (AttributeError, KeyError, IndexError):
            return Num(None), field_name


_FMT = _Formatter()
# a unit glued to an unknown number ("n/as", "n/a/s") reads as noise
_NA_UNIT = re.compile(r"n/a(?:/s|s|%|×)(?=\W|$)")


# an optional segment: dropped whole when any number in it is unknown
_OPTIONAL = re.compile(r"\[\[(.*?)\]\]")


def render(template: str, ctx: Mapping[str, Any]) -> str:
    """Format ``template`` against ``ctx``; unknown values render as ``n/a``.

    Text inside ``[[ ... ]]`` is optional: it is kept (without the brackets) only
    when every number in it is known, so triage never reads "queue p99 n/a".
    """
    text = " ".join(_FMT.vformat(template, (), ctx).split())
    text = _NA_UNIT.sub("n/a", text)
    text = _OPTIONAL.sub(lambda m: "" if "n/a" in m.group(1) else m.group(1), text)
    return " ".join(text.split()).replace(" ,", ",").replace(" ;", ";").replace(" .", ".")
