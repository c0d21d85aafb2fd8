"""The Prometheus edge: instant and range queries over the HTTP API, with typed errors.

kvwatch speaks ``/api/v1/query`` and ``/api/v1/query_range`` directly with
``requests`` because it needs what prometheus-api-client's query helpers hide:
response ``warnings``, the ``errorType``/``error`` body of a failed query, exact
(sub-second) range bounds, a per-request timeout and a fast path for large matrix
bodies. (prometheus-api-client serves elsewhere: :meth:`kvwatch.core.frame.FleetData.to_frame`.)

Everything that can go wrong on the wire is mapped onto the
:class:`~kvwatch.errors.PrometheusError` tree with the URL in the message. The
client counts queries, bytes received and response warnings so benchmarks and
self-metrics can report them. Tests inject a fake by passing any object with
the :class:`QueryClient` protocol to the pipeline.
"""

from __future__ import annotations

import io
import json
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import numpy as np
import pandas as pd
import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.exceptions import InsecureRequestWarning, ReadTimeoutError
from urllib3.util.retry import Retry

if TYPE_CHECKING:
    from kvwatch.config import PrometheusSettings

from kvwatch.errors import (
    PrometheusBadResponse,
    PrometheusError,
    PrometheusTimeout,
    PrometheusUnreachable,
)
from kvwatch.redact import basic_auth, register, split_userinfo

#: {"metric": {labels}, "value": [ts, "v"]} (instant) or {"metric": {labels}, "values": points} (range),
#: where points are [[ts, "v"], ...] or, from :func:`decode_matrix`, an (n, 2) float ndarray
Series = dict[str, Any]

# Prometheus encodes a matrix answer as exactly this prefix; anything else takes the json path.
_MATRIX_PREFIX = b'{"status":"success","data":{"resultType":"matrix","result":['
_SERIES_OPEN = b'{"metric":'
_VALUES_KEY = b',"values":['


def decode_matrix(body: bytes) -> list[Series] | None:
    """Fast decoder for a successful ``query_range`` answer; ``None`` when it cannot be sure.

    ``json.loads`` builds one Python list and two objects per sample, which dominates
    kvwatch's CPU at fleet scale. Here only the label objects go through ``json``; all
    sample pairs are parsed by numpy in one call. Inside JSON strings every ``"`` is
    escaped, so the structural markers ``{"metric":`` and ``,"values":[`` cannot occur
    within label values. Anything unexpected (warnings, native histograms, a count that
    does not add up, a sample value holding a bracket or quote) returns ``None`` and the
    caller falls back to ``json.loads``.
    """
    if not body.startswith(_MATRIX_PREFIX) or b'"histograms"' in body:
        return None
    if not body.endswith(b"]}}"):
        return None  # trailing "warnings"/"infos" or a truncated body
    pieces = body[len(_MATRIX_PREFIX) : -3].split(_SERIES_OPEN)
    if pieces[0] != b"":
        return None
    labels: list[bytes] = []
    blocks: list[bytes] = []
    counts: list[int] = []
    for i, piece in enumerate(pieces[1:]):
        cut = piece.find(_VALUES_KEY)
        tail = b"]]}" if i == len(pieces) - 2 else b"]]},"
        if cut < 0 or not piece.endswith(tail):
            return None
        block = piece[cut + len(_VALUES_KEY) : -len(tail) + 1]
        if not block.startswith(b"[") or b"]]" in block:
            return None
        labels.append(piece[:cut])
        blocks.append(block)
        counts.append(block.count(b"],[") + 1)
    if not labels:
        return []
    # every label object in one json call (one call per series cost more than the parse)
    try:
        metrics = json.loads(b"[" + b",".join(labels) + b"]")
    except ValueError:
        return None
    if len(metrics) != len(labels) or not all(isinstance(m, dict) for m in metrics):
        return None  # a label object that was not one object (cannot happen in a valid answer)
    joined = b"],[".join(blocks)
    total = sum(counts)
    # brackets and quotes only where the structure puts them: deleting them below must not
    # turn a malformed sample ("[1") into a number json would not read
    seps = len(blocks) - 1  # each join adds one "[" and one "]"
    if joined.count(b"[") != total + seps or joined.count(b"]") != total + seps or joined.count(b'"') != 2 * total:
        return None
    # one "ts,value" line per sample, parsed by pandas' C reader (~5x json.loads + float())
    text = joined.replace(b"],[", b"\n").translate(None, b'[]"')
    if text.count(b",") != total or text.count(b"\n") != total - 1:
        return None
    try:
        frame = pd.read_csv(
            io.BytesIO(text), header=None, names=("t", "v"), dtype=np.float64, engine="c"
        )
    except (ValueError, pd.errors.ParserError):
        return None
    points = frame.to_numpy(dtype=np.float64)
    if points.shape != (total, 2):
        return None
    out: list[Series] = []
    start = 0
    for metric, n in zip(metrics, counts, strict=True):
        out.append({"metric": metric, "values": points[start : start + n]})
        start += n
    return out


class QueryClient(Protocol):
    """What the pipeline needs from Prometheus."""

    url: str

    def instant(self, query: str, at: datetime) -> list[Series]: ...

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[Series]: ...


#: warnings kept per client; older ones are dropped so a long-running service stays bounded
MAX_WARNINGS = 50


@dataclass
class QueryStats:
    """Counters for one client: queries sent, errors, bytes received, warnings seen.

    ``warnings`` holds the most recent :data:`MAX_WARNINGS` texts; ``warnings_total``
    counts all of them, so a caller can take the ones of its own cycle with
    :meth:`warnings_since`.
    """

    queries: int = 0
    errors: int = 0
    bytes_received: int = 0
    warnings: list[str] = field(default_factory=list)
    warnings_total: int = 0
    #: wall seconds spent waiting for Prometheus (request sent → body read), summed over queries
    http_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, nbytes: int, warnings: list[str], error: bool, http_s: float = 0.0) -> None:
        with self._lock:
            self.queries += 1
            self.bytes_received += nbytes
            self.errors += int(error)
            self.http_seconds += http_s
            kept = warnings[:5]
            self.warnings.extend(kept)
            self.warnings_total += len(kept)
            del self.warnings[:-MAX_WARNINGS]

    def warnings_since(self, total_before: int) -> list[str]:
        """Warnings added after ``warnings_total`` was ``total_before`` (bounded by the buffer)."""
        with self._lock:
            new = self.warnings_total - total_before
            return self.warnings[-new:] if new > 0 else []


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
        query_params: dict[str, str] | None = None,
        ca_file: str = "",
        cert_file: str = "",
        key_file: str = "",
    ) -> None:
        # credentials in the URL travel as a Basic Authorization header, never in a shown URL
        clean, cred = split_userinfo(url)
        self.url = clean.rstrip("/")
        headers = dict(headers or {})
        if cred and not any(k.lower() == "authorization" for k in headers):
            headers["Authorization"] = basic_auth(*cred)
        register([*headers.values(), cred[1] if cred else None])  # the user name is not a secret
        #: sent with every query (Thanos: max_source_resolution, partial_response); ours win on a clash
        self.query_params = dict(query_params or {})
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
        try:
            urlsplit(self.url)
        except (TypeError, ValueError) as exc:
            raise PrometheusUnreachable(self.url, f"invalid URL: {exc}") from None
        session = requests.Session()
        # passed on every request: a session-level `verify` loses to REQUESTS_CA_BUNDLE /
        # CURL_CA_BUNDLE in the environment, which made `verify_tls: false` a no-op
        self._verify: bool | str = (ca_file or True) if verify_tls else False
        self._cert: str | tuple[str, str] | None = (cert_file, key_file) if key_file else cert_file or None
        session.verify = self._verify
        if not verify_tls:
            urllib3.disable_warnings(InsecureRequestWarning)  # chosen in config; one warning per query is noise
        session.headers.update(headers)
        session.mount(self.url, HTTPAdapter(max_retries=retry))
        self._session = session

    @classmethod
    def from_settings(cls, p: PrometheusSettings) -> PromClient:
        """A client configured by the ``prometheus`` section (secret headers unwrapped here only)."""
        return cls(
            p.url,
            timeout_s=p.timeout,
            retries=p.retries,
            headers={k: v.get_secret_value() for k, v in p.headers.items()},
            verify_tls=p.verify_tls,
            query_params=dict(p.query_params),
            ca_file=p.ca_file,
            cert_file=p.cert_file,
            key_file=p.key_file,
        )

    def close(self) -> None:
        self._session.close()

    def instant(self, query: str, at: datetime) -> list[Series]:
        """Evaluate ``query`` at instant ``at``; returns the ``result`` list (vector or matrix)."""
        return self._call(lambda: self._raw("query", {"query": query, "time": at.timestamp()}))

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[Series]:
        """Evaluate ``query`` over [start, end] every ``step_s`` seconds; returns matrix series."""
        params = {"query": query, "start": start.timestamp(), "end": end.timestamp(), "step": step_s}
        return self._call(lambda: self._raw("query_range", params))

    def _raw(self, endpoint: str, params: dict[str, Any]) -> list[Series]:
        t0 = time.perf_counter()
        resp = self._session.post(
            f"{self.url}/api/v1/{endpoint}",
            data={**self.query_params, **params},
            timeout=self.timeout_s,
            verify=self._verify,
            cert=self._cert,
        )
        body = resp.content
        http_s = time.perf_counter() - t0
        if resp.status_code == 200 and endpoint == "query_range":
            fast = decode_matrix(body)
            if fast is not None:
                self.stats.add(len(body), [], False, http_s)
                return fast
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            self.stats.add(len(body), [], True)
            snippet = body[:80].decode("utf-8", "replace").replace("\n", " ")
            raise PrometheusBadResponse(
                self.url, f"HTTP {resp.status_code} with a non-JSON body ({snippet!r}) for /api/v1/{endpoint}"
            ) from None
        if isinstance(doc, dict) and doc.get("status") not in ("success", "error"):
            self.stats.add(len(body), [], True)
            raise PrometheusBadResponse(
                self.url, f"HTTP {resp.status_code} with JSON that is not a Prometheus API answer (no \"status\") "
                f"for /api/v1/{endpoint}: is this the Prometheus base URL?")
        if not isinstance(doc, dict) or doc.get("status") != "success":
            self.stats.add(len(body), [], True)
            err = doc.get("error", "no error text") if isinstance(doc, dict) else "not a JSON object"
            etype = doc.get("errorType", "") if isinstance(doc, dict) else ""
            raise PrometheusBadResponse(self.url, f"HTTP {resp.status_code} {etype}: {err}".replace("  ", " "),
                                        status=resp.status_code if isinstance(doc, dict) else None)
        data = doc.get("data")
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list):
            self.stats.add(len(body), [], True)
            raise PrometheusBadResponse(self.url, "answer has no data.result list")
        raw_warnings = doc.get("warnings")
        warnings = [str(w) for w in raw_warnings] if isinstance(raw_warnings, list) else []
        self.stats.add(len(body), warnings, False, http_s)
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
            reason = _root_cause(exc)
            # urllib3 wraps a read timeout in MaxRetryError, which requests turns into ConnectionError
            if isinstance(reason, ReadTimeoutError | TimeoutError):
                raise PrometheusTimeout(self.url, f"no answer within {self.timeout_s:g}s") from None
            raise PrometheusUnreachable(self.url, f"unreachable ({_describe(reason)})") from None
        except requests.exceptions.RequestException as exc:
            self.stats.add(0, [], True)
            raise PrometheusBadResponse(self.url, str(exc).splitlines()[0][:200]) from None


def _root_cause(exc: BaseException) -> BaseException:
    """The innermost reason of a requests/urllib3 error chain (MaxRetryError.reason, args[0], __context__)."""
    seen: set[int] = set()
    cur: BaseException = exc
    while id(cur) not in seen:
        seen.add(id(cur))
        nxt = getattr(cur, "reason", None)
        if not isinstance(nxt, BaseException) and cur.args and isinstance(cur.args[0], BaseException):
            nxt = cur.args[0]
        if not isinstance(nxt, BaseException):
            nxt = cur.__context__
        if not isinstance(nxt, BaseException):
            break
        cur = nxt
    return cur


def _describe(reason: BaseException) -> str:
    """Short cause for messages: 'connection refused', 'RemoteDisconnected', ..."""
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    text = str(reason).split(": ", 1)[-1].strip()
    name = type(reason).__name__
    return f"{name}: {text[:120]}" if text and text != name else name
