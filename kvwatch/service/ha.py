"""An HA pair that pages Slack once: a lease read from the replicas' own heartbeats in Prometheus.

Every replica evaluates, tracks incidents and posts to Alertmanager (whose
cluster deduplicates); only the *leader* posts to Slack. Each replica exports
``kvwatch_ha_heartbeat_timestamp_seconds{replica="<id>"}`` (the end of its last
cycle) on /metrics; Prometheus scrapes every replica; each cycle a replica asks
Prometheus for the heartbeats of its group and the leader is the lowest replica
id whose heartbeat is younger than ``ha.lease`` (default two intervals). No
extra system is needed — both replicas already reach Prometheus — and the
answer is the same for both replicas, so at most one considers itself leader
once both see the same scrape.

A follower keeps its Slack items queued instead of sending them. It drops an
item once the live leader's heartbeat is one interval past the item's time (the
leader has evaluated the same data and sent the same message by then). When the
leader dies, its heartbeat ages past the lease, the follower becomes leader
within ``lease + scrape interval`` and sends what it still holds: a fire the dead
leader never sent is not lost. Residual risk, documented: a leader that dies
within one interval of sending a message, before its heartbeat shows it, may
have that one message repeated by the new leader. When Prometheus cannot be
asked, a replica keeps its last role (a follower never starts posting blind).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kvwatch.alerting.state import MemoryStore
from kvwatch.core.promclient import QueryClient
from kvwatch.core.selector import parse_selector, render_matchers
from kvwatch.errors import KvwatchError

log = logging.getLogger("kvwatch.service")

HEARTBEAT = "kvwatch_ha_heartbeat_timestamp_seconds"
#: sinks only the leader posts to (Alertmanager deduplicates by itself)
LEADER_SINKS = frozenset({"slack", "slack-webhook"})


def heartbeat_query(selector: str) -> str:
    """Newest heartbeat per replica among the series ``selector`` matches (e.g. ``{job="kvwatch"}``)."""
    matchers = render_matchers(parse_selector(selector, "ha.selector"))
    return f"max by (replica) ({HEARTBEAT}{{{matchers}}})"


@dataclass
class Lease:
    """This replica's view of who leads. ``role`` is ``leader`` or ``follower``."""

    replica: str
    selector: str
    lease_s: float
    role: str = "follower"  # until Prometheus has been asked once: never post blind
    leader: str = ""
    leader_heartbeat: float = 0.0
    known: bool = False
    #: replica → when its heartbeat was first seen live (continuously since)
    first_seen: dict[str, float] = field(default_factory=dict)

    def refresh(self, client: QueryClient, now: float) -> str:
        """Ask Prometheus for the group's heartbeats; returns the role for this cycle.

        Only replicas seen live for at least one lease are eligible: a replica that
        (re)starts follows until then, and a running leader hands over to a lower id
        only once that one has been visible for a lease too.
        """
        try:
            rows = client.instant(heartbeat_query(self.selector), datetime.fromtimestamp(now, tz=UTC))
        except KvwatchError as exc:
            log.warning("kvwatch: HA lease unknown (keeping role %s): %s", self.role, exc)
            return self.role
        live: dict[str, float] = {}
        for row in rows:
            rid = str(row.get("metric", {}).get("replica", ""))
            try:
                ts = float(row["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if rid and math.isfinite(ts) and now - ts <= self.lease_s:
                live[rid] = ts
        for rid in live:
            self.first_seen.setdefault(rid, now)
        for rid in [r for r in self.first_seen if r not in live]:
            del self.first_seen[rid]  # gone (stale or hung): must be seen for a whole lease again
        eligible = {r: ts for r, ts in live.items() if now - self.first_seen[r] >= self.lease_s}
        if self.replica not in live and (self.role != "follower" or not self.known):
            log.warning("kvwatch: HA replica %s: own heartbeat not in Prometheus (%s); not posting to "
                        "Slack until it is (check that Prometheus scrapes this replica and ha.selector)",
                        self.replica, heartbeat_query(self.selector))
        leader = min(eligible) if eligible else ""
        role = "leader" if leader and leader == self.replica else "follower"
        if leader and ((role, leader) != (self.role, self.leader) or not self.known):
            log.info("kvwatch: HA replica %s is %s (leader %s; live: %s)", self.replica, role, leader,
                     ", ".join(sorted(live)))
        self.role, self.leader, self.known = role, leader, True
        self.leader_heartbeat = eligible.get(leader, 0.0) if leader != self.replica else 0.0
        return self.role

    def settle(self, store: MemoryStore, interval_s: float, sinks: Iterable[str] = LEADER_SINKS) -> int:
        """Follower: drop queued leader-only items the live leader has had a full interval to send."""
        if self.role == "leader":
            return 0
        names = set(sinks)
        done = [i.id for i in store.due(float("inf"))
                if i.sink in names and self.leader_heartbeat >= i.event.at + interval_s]
        for item_id in done:
            store.delivered(item_id)
        return len(done)
