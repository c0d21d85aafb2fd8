"""A query too large for Prometheus' --query.max-samples is split by target, not lost."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from fixtures.core import fleet
from support.prom import backfill, prometheus

from kvwatch.core.collect import collect
from kvwatch.core.discover import discover
from kvwatch.core.promclient import PromClient

pytestmark = pytest.mark.prometheus


def test_too_many_samples_is_split_into_chunks_with_identical_data(tmp_path) -> None:
    end = float(int(time.time() // 60) * 60 - 7200)
    members = fleet.scale_fleet("chunk", 40)
    text = fleet.render(members, end, span_s=1200.0).text()
    backfill(text, tmp_path / "tsdb")
    at = datetime.fromtimestamp(end, tz=UTC)
    sel = 'fleet="chunk"'
    kw = {"at": at, "window_s": 600.0, "step_s": 30.0, "rate_window": "2m", "user_matchers": sel}

    with prometheus(tmp_path / "tsdb") as url:
        client = PromClient(url)
        targets = discover(client, at, 600.0, sel)
        reference = collect(client, targets, **kw)
        plain_queries = client.stats.queries
    # the same data behind a Prometheus that refuses any query loading > 2,000 samples
    with prometheus(tmp_path / "tsdb", extra_args=("--query.max-samples=2000",)) as url:
        client = PromClient(url)
        targets = discover(client, at, 600.0, sel)
        chunked = collect(client, targets, **kw)
        assert client.stats.errors > 0, "the limit must actually be hit for this test to mean anything"
        assert client.stats.queries > plain_queries

    assert len(targets) == 40
    for key, sigs in reference.series.items():
        for sig, vals in sigs.items():
            other = chunked.values(key, sig)
            assert other is not None, (key, sig)
            assert ((vals == other) | (vals != vals) & (other != other)).all(), (key, sig)
