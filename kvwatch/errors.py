"""The kvwatch exception tree.

Every error that reaches a user renders as one line naming *what* and *where*
(a file and key, a URL, a rule id). The CLI maps them to exit codes:
``ConfigError`` → 2, ``PrometheusError`` → 3.
"""

from __future__ import annotations

from dataclasses import dataclass


class KvwatchError(Exception):
    """Base of every error kvwatch raises on purpose."""


@dataclass(frozen=True)
class Problem:
    """One validation problem: where (file → rule → key), what was given, what was expected."""

    source: str
    location: str
    message: str

    def __str__(self) -> str:
        from kvwatch.redact import scrub  # errors is imported by everything; keep the import local
        from kvwatch.textsafe import printable

        where = f"{self.source}: {self.location}" if self.location else self.source
        return printable(scrub(f"{where}: {self.message}"))  # one problem, one line, whatever the input


class ConfigError(KvwatchError):
    """Configuration, rules or CLI usage are invalid. Carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem] | Problem | str) -> None:
        if isinstance(problems, str):
            problems = [Problem("config", "", problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


class SelectorError(ConfigError):
    """A PromQL label selector given by the user does not parse."""


class PrometheusError(KvwatchError):
    """Prometheus could not answer: the message always names the URL."""

    def __init__(self, url: str, detail: str) -> None:
        from kvwatch.redact import scrub

        self.url = scrub(url)
        self.detail = scrub(detail)
        super().__init__(f"Prometheus at {self.url}: {self.detail}")


class PrometheusUnreachable(PrometheusError):
    """Connection refused, DNS failure, TLS failure."""


class PrometheusTimeout(PrometheusError):
    """No answer within the configured timeout."""


class PrometheusBadResponse(PrometheusError):
    """HTTP error status, a non-JSON body, or a JSON body that is not a Prometheus API answer.

    ``status``: the HTTP status of an error the query API itself answered (JSON
    ``"status": "error"``); None for anything else (a proxy's page, a broken body)."""

    def __init__(self, url: str, detail: str, status: int | None = None) -> None:
        super().__init__(url, detail)
        self.status = status

    @property
    def refused(self) -> bool:
        """The API refused this query (4xx: a syntax it lacks, a limit) rather than failed to answer."""
        return self.status is not None and 400 <= self.status < 500
