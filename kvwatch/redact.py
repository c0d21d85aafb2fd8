"""Secrets never leave the process: URL credentials, the Slack token and webhook, header values.

Two tools, used everywhere a URL or a free-form message leaves kvwatch:

* :func:`split_userinfo` / :func:`clean_url` take ``user:password@`` out of a URL;
  the credentials travel as an ``Authorization: Basic`` header instead, so the
  URL itself can be shown in errors, logs, Slack buttons and Alertmanager's
  ``generatorURL``.
* :func:`scrub` replaces every registered secret (:func:`register`) and every
  secret-shaped string (URL userinfo, ``xox?-`` Slack tokens, Slack webhook
  paths) with ``<redacted>``. :class:`RedactingFilter` applies it to every log
  record; :func:`install` puts the filter on every handler there is (including
  logging's last-resort handler), because libraries such as ``slack_sdk`` log
  the full webhook URL from their retry handlers.
"""

from __future__ import annotations

import base64
import logging
import re
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit, urlunsplit

from kvwatch.textsafe import printable

if TYPE_CHECKING:
    from kvwatch.config import Settings

MASK = "<redacted>"
#: shorter secrets are not searched for in text (a 1-character password would mask every such letter);
#: secret-shaped patterns below still catch them in URLs
MIN_SECRET = 4

_PATTERNS = (
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s]+@"), r"\1" + MASK + "@"),
    (re.compile(r"\bxox[a-z]-[A-Za-z0-9-]+"), "xox-" + MASK),
    (re.compile(r"(hooks\.slack(?:-gov)?\.com/)[^\s'\"]+"), r"\1" + MASK),
)

_lock = threading.Lock()
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """``http://u:p@host/x`` → (``http://host/x``, (u, p)) with percent-decoding; no userinfo → (url, None)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url, None
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=host)), (unquote(user), unquote(password))


def basic_auth(user: str, password: str) -> str:
    """The ``Authorization`` header value for HTTP Basic credentials."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def clean_url(url: str) -> str:
    """``url`` without ``user:password@`` (safe to show, log or send)."""
    return split_userinfo(url)[0]


def register(values: Iterable[str | None]) -> None:
    """Remember secret values to mask wherever they appear (empty and very short ones are ignored)."""
    global _pattern
    with _lock:
        before = len(_secrets)
        _secrets.update(v for v in values if v and len(v) >= MIN_SECRET)
        if len(_secrets) != before:
            ordered = sorted(_secrets, key=len, reverse=True)  # longest first: a URL before its path
            _pattern = re.compile("|".join(re.escape(s) for s in ordered))


def scrub(text: str) -> str:
    """``text`` with registered secrets and secret-shaped strings replaced by ``<redacted>``."""
    pattern = _pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    for rx, repl in _PATTERNS:
        text = rx.sub(repl, text)
    return text


def settings_secrets(settings: Settings) -> list[str]:
    """Every secret value a configuration holds, with the forms in which it may be printed."""
    out: list[str] = []
    p, s = settings.prometheus, settings.slack
    for value in p.headers.values():
        v = value.get_secret_value()
        out.append(v)
        scheme, _, cred = v.partition(" ")  # "Bearer abc" is also printed as "abc"
        if cred and scheme.isalpha():
            out.append(cred)
    if s.bot_token:
        out.append(s.bot_token.get_secret_value())
    if s.webhook_url:
        hook = clean_url(s.webhook_url.get_secret_value())
        out.append(hook)
        path = urlsplit(hook).path
        out.append(path)
        out.append(path.rstrip("/").rsplit("/", 1)[-1])
    for url in (p.url, p.external_url, s.api_url, settings.links.grafana_url, *settings.alertmanager.urls):
        _, cred = split_userinfo(url)
        if cred:
            out.extend((cred[1], f"{cred[0]}:{cred[1]}", basic_auth(*cred).split(" ", 1)[1]))
    return out


class RedactingFilter(logging.Filter):
    """Masks secrets in the message, the arguments and the traceback of every record it sees."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a record whose args do not fit its format: show the format alone
            msg = str(record.msg)
        record.msg, record.args = printable(scrub(msg)), ()  # one record, one line: labels may hold newlines
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        return True


_FILTER = RedactingFilter()


def install(settings: Settings | None = None) -> None:
    """Register ``settings``' secrets and put the filter on every handler of every logger (idempotent)."""
    if settings is not None:
        register(settings_secrets(settings))
    handlers: list[logging.Handler] = list(logging.getLogger().handlers)
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            handlers.extend(logger.handlers)
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    for h in handlers:
        if _FILTER not in h.filters:
            h.addFilter(_FILTER)
