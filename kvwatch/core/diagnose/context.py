"""Template context of a matched rule: ``{kv_usage.mean:.0%}``, ``{window.waiting.max}``, facts.

Signal views are built on demand (most templates use a few); a name that is not
a statistic renders as n/a rather than failing the evaluation.
"""

from __future__ import annotations

from kvwatch.core.diagnose.view import TargetView
from kvwatch.core.rules import SIGNAL_NAMES
from kvwatch.core.templates import Num


class _Stats:
    """Template view of one signal's statistics over one span: ``{kv_usage.mean:.0%}``."""

    __slots__ = ("_name", "_span", "_view")

    def __init__(self, view: TargetView, name: str, span: float) -> None:
        self._view, self._name, self._span = view, name, span

    def __getattr__(self, stat: str) -> Num:
        try:
            value = self._view.stat(self._name, self._span, stat)
        except (AttributeError, KeyError, TypeError):
            return Num(None)  # not a statistic: the template renders n/a
        if value is None:
            return Num(None)
        bound = self._view.bound(self._name, self._span, stat, None, value)
        # past the last histogram bucket: "> 30.00", never a made-up number
        return Num(None) if bound == "?" else Num(value, lower=bound == ">")


class TemplateContext(dict):  # type: ignore[type-arg]
    """Template context that builds signal views on demand (most templates use a few)."""

    def __init__(self, view: TargetView, span_s: float, facts: dict[str, float | None]) -> None:
        super().__init__()
        self.view, self.span, self.facts = view, span_s, facts
        self["for_minutes"] = Num(span_s / 60)
        self["window_minutes"] = Num(view.p.window_s / 60)

    def __missing__(self, key: str) -> object:
        if key in self.facts:  # facts as numbers, built when a template reads one
            return Num(self.facts[key])
        if key == "window":
            return _Window(self.view)
        if key in SIGNAL_NAMES:
            return _Stats(self.view, key, self.span)
        raise KeyError(key)


class _Window:
    __slots__ = ("_view",)

    def __init__(self, view: TargetView) -> None:
        self._view = view

    def __getattr__(self, name: str) -> _Stats:
        return _Stats(self._view, name, self._view.p.window_s)
