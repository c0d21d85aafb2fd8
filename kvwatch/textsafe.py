"""Untrusted text made safe to show: label values and other data from engines and scrape configs.

Label values are controlled by whoever runs the engine or writes the scrape
config. Before they reach a terminal, a log line or a chat message they go
through :func:`printable` (control characters become visible escapes, so a
newline cannot fake an extra line and an ANSI sequence cannot recolour or
clear the screen) and, where space is bounded, :func:`clip_width`.
"""

from __future__ import annotations

import unicodedata

# bidirectional overrides/isolates reorder what follows them on screen (a "Trojan Source" label)
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
ELLIPSIS = "…"


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with control, line/paragraph-separator and bidi-override characters escaped.

    ``"a\\nb"`` → ``"a\\\\nb"``, ESC → ``"\\\\x1b"``. Emoji, ZWJ sequences and
    other printable unicode pass unchanged.
    """
    if text.isprintable():
        return text  # fast path: the common label has nothing to escape
    out = []
    for ch in text:
        if ch in _BIDI or unicodedata.category(ch) in ("Cc", "Zl", "Zp"):
            out.append(_escape(ch))
        else:
            out.append(ch)
    return "".join(out)


def clip_width(text: str, width: int) -> str:
    """At most ``width`` characters; a cut one ends in ``…`` (``width`` ≥ 1)."""
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)] + ELLIPSIS


def safe_label(text: str, width: int = 120) -> str:
    """A label value for one line of terminal or log output: escaped, then capped."""
    return clip_width(printable(text), width)
