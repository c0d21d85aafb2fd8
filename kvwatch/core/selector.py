"""Parse and re-render the user's PromQL label selector.

Accepted forms: ``{namespace="llm", pod=~"vllm-.*"}``, the same without braces,
or empty. Values are re-escaped on output so quotes, backslashes and unicode in
label values cannot break the queries built from them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvwatch.errors import Problem, SelectorError

_LABEL = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*")
_OPS = ("=", "!=", "=~", "!~")


@dataclass(frozen=True)
class Matcher:
    """One label matcher; ``value`` is the unescaped string."""

    label: str
    op: str
    value: str

    def render(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.label}{self.op}"{escaped}"'


_RE2_UNSUPPORTED = re.compile(r"\(\?<?[=!]|\\[1-9]")
_UNICODE_CLASS = re.compile(r"\\[pP](\{[^}]*\}|[A-Za-z])")


def _check_re2(value: str, where: str, label: str) -> None:
    """Reject regexes Prometheus (RE2) would reject, as far as Python's engine can tell.

    Lookarounds and back-references are Python-only; ``\\p{L}`` classes are RE2-only,
    so they are neutralised before Python compiles the rest.
    """
    if _RE2_UNSUPPORTED.search(value):
        raise SelectorError(
            Problem(where, label, f"regex {value!r} uses lookaround or back-references, which Prometheus (RE2) rejects")
        )
    try:
        re.compile(_UNICODE_CLASS.sub(".", value))
    except re.error as exc:
        raise SelectorError(Problem(where, label, f"invalid regex {value!r}: {exc}")) from None


def _read_string(text: str, pos: int, where: str) -> tuple[str, int]:
    quote = text[pos] if pos < len(text) else ""
    if quote not in ('"', "'", "`"):
        raise SelectorError(Problem(where, f"offset {pos}", f"expected a quoted value, got {text[pos:pos + 10]!r}"))
    out: list[str] = []
    i = pos + 1
    while i < len(text):
        ch = text[i]
        if ch == "\\" and quote != "`" and i + 1 < len(text):
            nxt = text[i + 1]
            out.append({"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}.get(nxt, "\\" + nxt))
            i += 2
            continue
        if ch == quote:
            return "".join(out), i + 1
        out.append(ch)
        i += 1
    raise SelectorError(Problem(where, f"offset {pos}", "unterminated quoted value"))


def _closing_brace(body: str) -> int:
    """Index of the '}' closing the leading '{', skipping quoted values; -1 if none."""
    quote = ""
    i = 1
    while i < len(body):
        ch = body[i]
        if quote:
            if ch == "\\" and quote != "`":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'`":
            quote = ch
        elif ch == "}":
            return i
        i += 1
    return -1


def parse_selector(text: str | None, where: str = "--selector") -> tuple[Matcher, ...]:
    """Parse a selector; raise :class:`SelectorError` naming ``where`` and the offset."""
    if text is None:
        return ()
    body = text.strip()
    if body.startswith("{"):
        close = _closing_brace(body)
        if close < 0 and body.endswith("}"):
            close = len(body) - 1  # an unterminated quote swallowed the brace: the parser names it
        if close < 0:
            raise SelectorError(Problem(where, "", f"selector {text!r} opens '{{' but does not close it"))
        if body[close + 1 :].strip():
            extra = body[close + 1 :].strip()
            raise SelectorError(Problem(
                where, "", f"selector {text!r} has {extra[:40]!r} after '}}': only label matchers like "
                '{namespace="llm"} are allowed (no PromQL operators, functions or metric names)'))
        body = body[1:close]
    elif not re.match(r"\s*[a-zA-Z_]", body) and body:
        raise SelectorError(Problem(where, "", f"selector {text!r}: expected label matchers like {{namespace=\"llm\"}}"))
    matchers: list[Matcher] = []
    pos = 0
    while pos < len(body):
        if body[pos:].strip() == "":
            break
        m = _LABEL.match(body, pos)
        if not m:
            raise SelectorError(
                Problem(where, f"offset {pos}", f"expected label matcher like name=\"value\" in {text!r}")
            )
        if m.group(1) == "__name__":
            raise SelectorError(Problem(
                where, m.group(1), "the selector scopes targets by labels (job, namespace, ...); kvwatch picks the "
                "metric names itself, so __name__ is not allowed"))
        value, pos = _read_string(body, m.end(), where)
        if m.group(2) in ("=~", "!~"):
            _check_re2(value, where, m.group(1))
        matchers.append(Matcher(m.group(1), m.group(2), value))
        rest = body[pos:].lstrip()
        if rest.startswith(","):
            pos = len(body) - len(rest) + 1
        elif rest:
            raise SelectorError(Problem(where, f"offset {pos}", f"expected ',' or end of selector in {text!r}"))
        else:
            break
    return tuple(matchers)


def render_matchers(matchers: tuple[Matcher, ...]) -> str:
    """Comma-joined matchers without braces ('' when none)."""
    return ", ".join(m.render() for m in matchers)


def target_matchers(job: str, instance: str) -> str:
    """Escaped matchers selecting one target: label values may hold quotes or backslashes."""
    return render_matchers((Matcher("job", "=", job), Matcher("instance", "=", instance)))
