"""The Prometheus edge: a typed wrapper around ``prometheus_api_client``.

Everything that can go wrong on the wire is mapped onto the
:class:`~kvwatch.errors.PrometheusError` tree with the URL in the message. The
client counts queries, bytes received and response warnings so benchmarks and
self-metrics can report them. Tests inject a fake by passing any object with
the :class:`QueryClient` protocol to the pipeline.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from kvwatch.errors import (
    PrometheusBadResponse,
    PrometheusError,
    PrometheusTimeout,
    PrometheusUnreachable,
)

Series = dict[str, Any]  # {"metric": {labels}, "value": [ts, "v"]} or {"metric", "values": [[ts, "v"], ...]}


class QueryClient(Protocol):
    """What the pipeline needs from Prometheus."""

    url: str

    def instant(self, query: str, at: datetime) -> list[Series]: ...

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[Series]: ...


@dataclass
class QueryStats:
    """Counters for one client: queries sent, errors, bytes received, warnings seen."""

    queries: int = 0
    errors: int = 0
    bytes_received: int = 0
    warnings: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, nbytes: int, warnings: list[str], error: bool) -> None:
        with self._lock:
            self.queries += 1
            self.bytes_received += nbytes
            self.errors += int(error)
            self.warnings.extend(warnings[:5])


class PromClient:
    """Instant and range queries with a default timeout, bounded retries and typed errors.

    ``timeout_s`` applies to every request (connect and read). ``retries`` retries
    502/503/504 and connection errors with exponential backoff; other errors fail
    at once. ``headers`` (e.g. ``Authorization``) are sent but never logged.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 10.0,
        retries: int = 1,
        headers: dict[str, str] | None = None,
        verify_tls: bool = True,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.stats = QueryStats()
        retry = Retry(
            total=retries,
            connect=retries,
            read=0,
            backoff_factor=0.2,
            status_forcelist=(502, 503, 504),
            allowed_methods=("GET", "POST"),
            raise_on_status=False,
        )
        session = requests.Session()
        session.verify = verify_tls
        try:
            self._prom = PrometheusConnect(
                url=self.url, headers=headers or {}, retry=retry, session=session, timeout=timeout_s
            )
        except (TypeError, ValueError) as exc:
            raise PrometheusUnreachable(url, f"invalid URL: {exc}") from None
        self._session = session

    def close(self) -> None:
        self._prom.close()

    def instant(self, query: str, at: datetime) -> list[Series]:
        """Evaluate ``query`` at instant ``at``; returns the ``result`` list (vector or matrix)."""
        return self._call(lambda: self._raw("query", {"query": query, "time": at.timestamp()}))

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[Series]:
        """Evaluate ``query`` over [start, end] every ``step_s`` seconds; returns matrix series."""
        params = {"query": query, "start": start.timestamp(), "end": end.timestamp(), "step": step_s}
        return self._call(lambda: self._raw("query_range", params))

    # prometheus_api_client's custom_query drops warnings and rounds range bounds to whole
    # seconds; we use its configured session (retries, TLS, headers) and parse ourselves.
    def _raw(self, endpoint: str, params: dict[str, Any]) -> list[Series]:
        resp = self._prom._session.request(
            method="POST",
            url=f"{self.url}/api/v1/{endpoint}",
            data=params,
            headers=self._prom.headers,
            timeout=self.timeout_s,
        )
        body = resp.content
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            self.stats.add(len(body), [], True)
            snippet = body[:80].decode("utf-8", "replace").replace("\n", " ")
            raise PrometheusBadResponse(
                self.url, f"HTTP {resp.status_code} with a non-JSON body ({snippet!r}) for /api/v1/{endpoint}"
            ) from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            self.stats.add(len(body), [], True)
            err = doc.get("error", "no error text") if isinstance(doc, dict) else "not a JSON object"
            etype = doc.get("errorType", "") if isinstance(doc, dict) else ""
            raise PrometheusBadResponse(self.url, f"HTTP {resp.status_code} {etype}: {err}".replace("  ", " "))
        data = doc.get("data")
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list):
            self.stats.add(len(body), [], True)
            raise PrometheusBadResponse(self.url, "answer has no data.result list")
        warnings = [str(w) for w in doc.get("warnings") or []]
        self.stats.add(len(body), warnings, False)
        if data.get("resultType") == "scalar":
            return []
        return [s for s in result if isinstance(s, dict)]

    def _call(self, fn: Any) -> list[Series]:
        try:
            return fn()
        except PrometheusError:
            raise
        except requests.exceptions.Timeout:
            self.stats.add(0, [], True)
            raise PrometheusTimeout(self.url, f"no answer within {self.timeout_s:g}s") from None
        except (requests.exceptions.ConnectionError, requests.exceptions.RetryError) as exc:
            self.stats.add(0, [], True)
            reason = type(exc).__name__
            raise PrometheusUnreachable(self.url, f"unreachable ({reason})") from None
        except (requests.exceptions.RequestException, PrometheusApiClientException) as exc:
            self.stats.add(0, [], True)
            raise PrometheusBadResponse(self.url, str(exc).splitlines()[0][:200]) from None
