"""The Slack lease's rules, with Prometheus' answers given directly (the live pair is tests/test_ha.py)."""

from __future__ import annotations

from datetime import datetime

from test_lifecycle import diag, lc, result

from kvwatch.alerting.state import MemoryStore
from kvwatch.core.promclient import Series
from kvwatch.errors import PrometheusUnreachable
from kvwatch.service.ha import HEARTBEAT, Lease, heartbeat_query


class Heartbeats:
    """A QueryClient answering the heartbeat query with ``beats`` (replica → timestamp)."""

    def __init__(self, beats: dict[str, float] | None = None) -> None:
        self.beats = beats
        self.queries: list[str] = []

    def instant(self, query: str, at: datetime) -> list[Series]:
        self.queries.append(query)
        if self.beats is None:
            raise PrometheusUnreachable("http://prom", "connection refused")
        return [{"metric": {"replica": r}, "value": [at.timestamp(), str(ts)]} for r, ts in self.beats.items()]

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[Series]:
        raise AssertionError("the lease asks one instant query")


def test_query_reads_the_groups_heartbeats() -> None:
    assert heartbeat_query('{job="kvwatch", shard="0"}') == (
        f'max by (replica) ({HEARTBEAT}{{job="kvwatch", shard="0"}})')


def test_lowest_live_replica_leads_and_the_dead_do_not_count() -> None:
    now = 1000.0
    a, b = Lease("a", '{job="kvwatch"}', 30.0), Lease("b", '{job="kvwatch"}', 30.0)
    client = Heartbeats({"a": now - 5, "b": now - 3})
    a.refresh(client, now - 30)
    b.refresh(client, now - 30)
    assert (a.refresh(client, now), b.refresh(client, now)) == ("leader", "follower")
    client.beats = {"a": now - 31, "b": now - 3}  # a hung: its heartbeat is older than the lease
    assert b.refresh(client, now) == "leader"
    client.beats = {"b": now - 3}  # a dead: its series went stale
    assert b.refresh(client, now) == "leader"


def test_leads_only_a_lease_after_its_own_heartbeat_shows() -> None:
    now = 1000.0
    b = Lease("b", '{job="kvwatch"}', 30.0)
    assert b.refresh(Heartbeats({}), now) == "follower"  # just started: nobody visible yet
    assert b.refresh(Heartbeats({"b": now - 1}), now) == "follower"  # a slower peer "a" may still show
    assert b.refresh(Heartbeats({"b": now + 29}), now + 29) == "follower"
    assert b.refresh(Heartbeats({"b": now + 30}), now + 30) == "leader"


def test_unknown_lease_keeps_the_last_role() -> None:
    now = 1000.0
    a, b = Lease("a", "", 30.0), Lease("b", "", 30.0)
    for t in (now - 30, now):
        beats = Heartbeats({"a": t, "b": t})
        a.refresh(beats, t)
        b.refresh(beats, t)
    down = Heartbeats(None)
    assert (a.refresh(down, now + 10), b.refresh(down, now + 10)) == ("leader", "follower")


def test_follower_drops_what_the_leader_has_had_an_interval_to_send() -> None:
    store = MemoryStore()
    _, events = lc().step({}, [result(diag())], 100.0)
    for e in events:
        store.enqueue("slack", e)
        store.enqueue("alertmanager-like", e)
    follower = Lease("b", "", 30.0, first_seen={"a": 0.0, "b": 0.0})
    follower.refresh(Heartbeats({"a": 150.0, "b": 150.0}), 155.0)  # a's last cycle ended before 100 + 60
    assert follower.settle(store, interval_s=60.0) == 0 and store.pending() == 2
    follower.refresh(Heartbeats({"a": 161.0, "b": 160.0}), 165.0)  # a has run a cycle past the event
    assert follower.settle(store, interval_s=60.0) == 1
    assert [i.sink for i in store.due(float("inf"))] == ["alertmanager-like"]  # only leader sinks dropped
    leader = Lease("a", "", 30.0, first_seen={"a": 0.0})
    leader.refresh(Heartbeats({"a": 161.0}), 165.0)
    assert leader.settle(store, interval_s=60.0) == 0


def test_a_restarted_lower_id_takes_over_only_after_a_lease() -> None:
    b = Lease("b", "", 30.0, first_seen={"b": 0.0})
    assert b.refresh(Heartbeats({"b": 999.0}), 1000.0) == "leader"
    assert b.refresh(Heartbeats({"a": 1001.0, "b": 1001.0}), 1002.0) == "leader"  # a just (re)started
    assert b.refresh(Heartbeats({"a": 1031.0, "b": 1031.0}), 1032.0) == "follower"  # a visible for a lease
    assert b.leader == "a"
