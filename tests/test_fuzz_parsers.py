"""Property-based tests: every parser either succeeds or raises its documented error.

config → ConfigError, rules → ConfigError, selector → SelectorError (a ConfigError),
durations → ValueError, Prometheus answers → PrometheusError; ``collect._to_grid``
never raises and never turns a missing or non-finite sample into 0.
"""

from __future__ import annotations

import contextlib
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvwatch.config import Settings, load_settings
from kvwatch.core.collect import _to_grid, collect
from kvwatch.core.models import Target, TargetKey
from kvwatch.core.promclient import PromClient, decode_matrix
from kvwatch.core.rules import load_rule_file
from kvwatch.core.selector import Matcher, parse_selector, render_matchers
from kvwatch.durations import format_duration, parse_duration
from kvwatch.errors import ConfigError, PrometheusError, SelectorError

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20), st.sampled_from(["30s", "5m", "1h", "-1s", "0", "http://x", "vllm-v1", "full", "critical"]),
)
json_like = st.recursive(
    scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=12), kids, max_size=4)),
    max_leaves=20,
)
CONFIG_KEYS = {
    "prometheus": ["url", "timeout", "retries", "headers", "max_concurrency", "verify_tls"],
    "discovery": ["selector", "dialects"],
    "evaluation": ["interval", "window", "step", "rate_window", "ttft_slo"],
    "slack": ["bot_token", "channel", "routes", "webhook_url"],
    "lifecycle": ["pending_for", "hold_down", "silences"],
    "server": ["host", "port"],
}


@st.composite
def config_docs(draw: st.DrawFn) -> Any:
    """Mostly-plausible config mappings (real sections and keys, arbitrary values) or any YAML value."""
    if draw(st.booleans()):
        return draw(json_like)
    doc: dict[str, Any] = {}
    for section in draw(st.lists(st.sampled_from([*CONFIG_KEYS, "bogus"]), max_size=4, unique=True)):
        keys = CONFIG_KEYS.get(section, ["x"])
        doc[section] = draw(st.one_of(
            st.dictionaries(st.sampled_from(keys), json_like, max_size=4), json_like))
    return doc


def _write(tmp_path: Path, name: str, doc: Any) -> Path:
    path = tmp_path / name
    try:
        path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    except yaml.YAMLError:
        path.write_text(str(doc))
    return path


@FUZZ
@given(doc=config_docs())
def test_config_only_raises_config_error(tmp_path: Path, doc: Any) -> None:
    path = _write(tmp_path, "kvwatch.yaml", doc)
    try:
        s = load_settings(path, environ={})
    except ConfigError as exc:
        assert exc.problems and all(str(p) for p in exc.problems)
        return
    assert isinstance(s, Settings)
    assert s.evaluation.step > 0 and s.evaluation.window >= 4 * s.evaluation.step


@FUZZ
@given(text=st.text(max_size=200))
def test_config_raw_text(tmp_path: Path, text: str) -> None:
    path = tmp_path / "raw.yaml"
    path.write_text(text, encoding="utf-8")
    with contextlib.suppress(ConfigError):
        load_settings(path, environ={})


LEAF = st.fixed_dictionaries(
    {"signal": st.sampled_from(["kv_usage", "waiting", "nope", "ttft_tail_ratio"]),
     "op": st.sampled_from([">", ">=", "<", "=<"]), "value": json_like},
    optional={"stat": st.sampled_from(["mean", "frac_above", "p99", "bogus"]), "arg": json_like,
              "over": st.sampled_from(["for", "window", "later"])},
)
RULE = st.fixed_dictionaries(
    {"id": st.text(max_size=10), "mode": st.sampled_from(["full", "idle", "broken"]),
     "severity": st.sampled_from(["warning", "critical", "meh"]),
     "when": st.one_of(LEAF, st.fixed_dictionaries({"all": st.lists(LEAF, max_size=3)}), json_like),
     "summary": st.one_of(st.text(max_size=30), st.just("{kv_usage.mean:.0%} {nope}"), json_like),
     "triage": st.one_of(st.lists(st.text(max_size=20), max_size=3), json_like)},
    optional={"for": json_like, "description": json_like},
)


@FUZZ
@given(doc=st.one_of(json_like, st.fixed_dictionaries({"version": st.one_of(st.just(1), json_like),
                                                       "rules": st.one_of(st.lists(RULE, max_size=3), json_like)})))
def test_rules_only_raise_config_error(tmp_path: Path, doc: Any) -> None:
    path = _write(tmp_path, "rules.yaml", doc)
    try:
        rules = load_rule_file(path)
    except ConfigError as exc:
        assert all(str(path) in str(p) for p in exc.problems)
        return
    assert isinstance(rules, tuple)


@FUZZ
@given(text=st.text(max_size=80))
def test_selector_arbitrary_text(text: str) -> None:
    with contextlib.suppress(SelectorError):
        parse_selector(text)


labels = st.builds(
    lambda a, b: a + b,
    st.sampled_from("abcxyzABC_"),
    st.text(alphabet="abcxyz_019AZ", max_size=8),
)
matcher = st.builds(Matcher, labels, st.sampled_from(["=", "!="]), st.text(max_size=15))


@FUZZ
@given(ms=st.lists(matcher, max_size=4), braces=st.booleans())
def test_selector_round_trip(ms: list[Matcher], braces: bool) -> None:
    text = render_matchers(tuple(ms))
    assert parse_selector("{" + text + "}" if braces else text) == tuple(ms)


@FUZZ
@given(text=st.one_of(st.text(max_size=12), st.integers(-5, 10**6), st.floats()))
def test_durations(text: Any) -> None:
    try:
        s = parse_duration(text)
    except ValueError:
        return
    assert s >= 0 or math.isnan(s)


@FUZZ
@given(n=st.integers(0, 10**7))
def test_duration_round_trip(n: int) -> None:
    assert parse_duration(format_duration(n)) == n


# ----------------------------------------------------------------- Prometheus answers


class _FakeAdapter(requests.adapters.BaseAdapter):
    """A requests transport answering every call with one canned response."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__()
        self.status, self.body = status, body

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        resp = requests.Response()
        resp.status_code, resp._content, resp.url, resp.request = self.status, self.body, request.url or "", request
        return resp

    def close(self) -> None:
        pass


_CLIENT = PromClient("http://prom.test:9090", timeout_s=1, retries=0)


def _client(status: int, body: bytes) -> PromClient:
    """The shared client with its transport swapped for a canned answer (building one is slow)."""
    _CLIENT._session.mount("http://", _FakeAdapter(status, body))
    return _CLIENT


sample_values = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(
    lambda f: "NaN" if math.isnan(f) else ("+Inf" if f == math.inf else ("-Inf" if f == -math.inf else repr(f)))),
    st.text(max_size=6), st.integers(), st.none())
points = st.lists(st.tuples(st.one_of(st.integers(0, 2**33), st.floats(), st.text(max_size=4)), sample_values)
                  .map(list), max_size=6)
label_maps = st.dictionaries(st.sampled_from(["job", "instance", "__name__", "le", "x"]), st.text(max_size=8), max_size=4)
series = st.fixed_dictionaries({"metric": st.one_of(label_maps, json_like), "values": st.one_of(points, json_like)})
answers = st.one_of(
    json_like,
    st.fixed_dictionaries({
        "status": st.sampled_from(["success", "error"]),
        "data": st.one_of(json_like, st.fixed_dictionaries({
            "resultType": st.sampled_from(["matrix", "vector", "scalar"]),
            "result": st.one_of(st.lists(series, max_size=3), json_like)})),
    }, optional={"warnings": json_like, "error": json_like, "errorType": json_like}),
)
AT = datetime(2025, 3, 1, tzinfo=UTC)


@FUZZ
@given(doc=answers, status=st.sampled_from([200, 400, 422, 500, 503]), compact=st.booleans())
def test_prometheus_answers_parse_or_raise_prometheus_error(doc: Any, status: int, compact: bool) -> None:
    body = json.dumps(doc, separators=(",", ":") if compact else None).encode()
    client = _client(status, body)
    try:
        rows = client.range("up", AT, AT, 30)
    except PrometheusError as exc:
        assert "http://prom.test:9090" in str(exc)
        return
    assert isinstance(rows, list) and all(isinstance(r, dict) for r in rows)
    # whatever came back, collection survives it
    targets = [Target(TargetKey("j", "i"), "vllm-v1", "vllm", names=frozenset({"vllm:kv_cache_usage_perc"}))]
    collect(_StaticClient(rows), targets, at=AT, window_s=300, step_s=30, rate_window="2m", user_matchers="")


class _StaticClient:
    url = "http://static"

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def instant(self, query: str, at: datetime) -> list[dict[str, Any]]:
        return self.rows

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[dict[str, Any]]:
        return self.rows


@FUZZ
@given(body=st.binary(max_size=200), status=st.sampled_from([200, 500]))
def test_prometheus_arbitrary_bytes(body: bytes, status: int) -> None:
    with contextlib.suppress(PrometheusError):
        _client(status, body).instant("up", AT)


finite_or_not = st.floats(allow_nan=True, allow_infinity=True, width=64)
good_series = st.lists(
    st.fixed_dictionaries({
        "metric": st.fixed_dictionaries({"job": st.text(max_size=6), "instance": st.text(max_size=6)}),
        "values": st.lists(st.tuples(st.integers(1_700_000_000, 1_700_000_600), finite_or_not), max_size=8, unique_by=lambda p: p[0]),
    }),
    max_size=4,
)


def _prom_num(v: float) -> str:
    return "NaN" if math.isnan(v) else ("+Inf" if v == math.inf else ("-Inf" if v == -math.inf else repr(v)))


@FUZZ
@given(rows=good_series)
def test_fast_matrix_decoder_matches_json(rows: list[dict[str, Any]]) -> None:
    wire = [{"metric": r["metric"], "values": [[t, _prom_num(v)] for t, v in r["values"]]} for r in rows]
    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": wire}}, separators=(",", ":"))
    fast = decode_matrix(body.encode())
    if any(not r["values"] for r in rows):
        return  # Prometheus never sends a series without samples; the json path handles it
    assert fast is not None, "a well-formed compact matrix must take the fast path"
    assert [r["metric"] for r in fast] == [r["metric"] for r in rows]
    for got, want in zip(fast, rows, strict=True):
        exp = np.array([[t, v] for t, v in want["values"]], dtype=float).reshape(-1, 2)
        np.testing.assert_array_equal(got["values"], exp)


@FUZZ
@given(values=st.one_of(points, json_like), n=st.integers(0, 12), step=st.sampled_from([15.0, 30.0, 0.0, -1.0]))
def test_to_grid_never_raises(values: Any, n: int, step: float) -> None:
    grid = 1_700_000_000 + 30.0 * np.arange(n)
    out = _to_grid({"values": values}, grid, step)
    assert out.shape == (n,)


@FUZZ
@given(vals=st.lists(finite_or_not, min_size=1, max_size=20))
def test_to_grid_keeps_non_finite_as_missing(vals: list[float]) -> None:
    grid = 1_700_000_000 + 30.0 * np.arange(len(vals))
    wire = [[float(t), _prom_num(v)] for t, v in zip(grid, vals, strict=True)]
    out = _to_grid({"values": wire}, grid, 30.0)
    want = np.array(vals)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    assert not np.any((out == 0) & (want != 0))


@pytest.mark.parametrize("body", [b"", b"{", b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{}'])
def test_prometheus_truncated_bodies(body: bytes) -> None:
    with pytest.raises(PrometheusError):
        _client(200, body).range("up", AT, AT, 30)


def _json_decoded(body: bytes) -> list[tuple[Any, np.ndarray | None]] | None:
    """What the json path makes of a matrix body: (labels, points as _points reads them) per series."""
    from kvwatch.core.collect import _points

    try:
        doc = json.loads(body)
        result = doc["data"]["result"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(result, list):
        return None
    return [(r.get("metric"), _points(r.get("values"))) for r in result if isinstance(r, dict)]


def _agrees_with_json(body: bytes) -> bool:
    """decode_matrix either declines (None) or returns exactly what json.loads gives."""
    fast = decode_matrix(body)
    if fast is None:
        return True
    want = _json_decoded(body)
    assert want is not None, body
    assert [m for m, _ in want] == [r["metric"] for r in fast]
    for got, (_, exp) in zip(fast, want, strict=True):
        assert exp is not None
        np.testing.assert_array_equal(got["values"], exp)
        assert got["values"].dtype == np.float64 and got["values"].shape == exp.shape
    return True


awkward_labels = st.dictionaries(
    st.sampled_from(["job", "instance", "le", "metric", "values", "x"]),
    st.sampled_from(['{"metric":', ',"values":[', "]]},", "[", "]", '"', "\\", "a", "", "1.0"]), max_size=4)
many_series = st.lists(
    st.fixed_dictionaries({
        "metric": awkward_labels,
        "values": st.lists(st.tuples(st.integers(1_700_000_000, 1_700_000_600), finite_or_not), min_size=1,
                           max_size=5, unique_by=lambda p: p[0]),
    }),
    min_size=1, max_size=6,
)


def _wire(rows: list[dict[str, Any]]) -> bytes:
    wire = [{"metric": r["metric"], "values": [[t, _prom_num(v)] for t, v in r["values"]]} for r in rows]
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": wire}},
                      separators=(",", ":")).encode()


@FUZZ
@given(rows=many_series)
def test_fast_matrix_decoder_awkward_labels(rows: list[dict[str, Any]]) -> None:
    """Labels that spell the decoder's markers (a label named ``metric``, values with brackets):
    the fast path declines or agrees with json, never misreads; plain labels take the fast path."""
    body = _wire(rows)
    assert _agrees_with_json(body)
    if all(set(r["metric"]) <= {"job", "instance", "le", "x"} for r in rows):
        assert decode_matrix(body) is not None


@FUZZ
@given(rows=many_series, cuts=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 3),
                                                   st.sampled_from(list(b'[]{},":0.NI\n'))), min_size=1, max_size=3))
def test_fast_matrix_decoder_mutated_bodies(rows: list[dict[str, Any]], cuts: list[tuple[int, int, int]]) -> None:
    """A body damaged near its structure (bytes deleted, inserted, replaced) is declined or
    decoded exactly as json decodes it (when json can)."""
    body = bytearray(_wire(rows))
    for pos, op, byte in cuts:
        i = pos % len(body)
        if op == 0:
            del body[i]
        elif op == 1:
            body.insert(i, byte)
        else:
            body[i] = byte
    fast = decode_matrix(bytes(body))
    if fast is not None and _json_decoded(bytes(body)) is not None:
        assert _agrees_with_json(bytes(body))
