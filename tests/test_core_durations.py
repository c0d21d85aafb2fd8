"""Prometheus-style durations and RFC 3339 instants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvwatch.durations import format_duration, parse_duration, parse_time


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0), ("2d", 172800.0), ("1w", 604800.0),
        ("500ms", 0.5), ("1m30s", 90.0), ("1.5h", 5400.0), ("45", 45.0), (" 10m ", 600.0),
        (12, 12.0), (0.25, 0.25), ("0s", 0.0),
    ],
)
def test_parse(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "5 minutes", "m5", "5x", "1h 30m", "-5m", "5m3", "abc", True, -1, "1.h"])
def test_parse_rejects(bad: str | float) -> None:
    with pytest.raises(ValueError) as err:
        parse_duration(bad)
    assert repr(bad) in str(err.value) or "negative" in str(err.value)


@pytest.mark.parametrize(
    ("seconds", "text"), [(90, "1m30s"), (0.5, "500ms"), (3600, "1h"), (86400 + 61, "1d1m1s"), (0, "0ms"), (120, "2m")]
)
def test_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@settings(max_examples=200)
@given(st.integers(min_value=1, max_value=10 * 86400))
def test_format_parse_round_trip_whole_seconds(n: int) -> None:
    assert parse_duration(format_duration(n)) == n


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-29T10:00:00Z", datetime(2026, 11, 29, 10, tzinfo=UTC)),
        ("2026-11-29T12:00:00+02:00", datetime(2026, 11, 29, 10, tzinfo=UTC)),
        ("2026-11-29T10:00:00", datetime(2026, 11, 29, 10, tzinfo=UTC)),  # naive → UTC
        ("1700000000", datetime.fromtimestamp(1_700_000_000, tz=UTC)),
        ("1700000000.5", datetime.fromtimestamp(1_700_000_000.5, tz=UTC)),
    ],
)
def test_parse_time(text: str, expected: datetime) -> None:
    got = parse_time(text)
    assert got == expected and got.tzinfo is not None


def test_parse_time_keeps_offsets() -> None:
    assert parse_time("2026-11-29T10:00:00-05:00").utcoffset() == timezone(timedelta(hours=-5)).utcoffset(None)


@pytest.mark.parametrize("bad", ["yesterday", "2026-13-01T00:00:00Z", ""])
def test_parse_time_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_time(bad)
