"""Persistent state: open incidents, the delivery outbox and Slack thread references.

The in-process copy (:class:`MemoryStore`) is the source of truth while kvwatch
runs; :class:`SqliteStore` writes every change through, each change in one
transaction, so a restart neither re-sends nor forgets. Incidents and the
outbox entries for their events are committed together: a crash loses both
(the next cycle recomputes the same events) or keeps both. When the file is
corrupt or unwritable, :func:`open_store` / :class:`ResilientStore` log one line
naming the path, count the error and carry on in memory; kvwatch never
crash-loops on its state file.

Delivery is at-least-once: an attempt is recorded *before* the HTTP call, the
success after it. A crash between the two (a window of one HTTP request) can
repeat that one message; it is never lost.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from kvwatch.alerting.lifecycle import Event, Incident, IncidentKey

log = logging.getLogger("kvwatch.alerting.state")


@dataclass(frozen=True)
class OutboxItem:
    """A notification to deliver to one ``sink``. ``next_attempt_at`` is Unix seconds."""

    id: int
    sink: str
    event: Event
    attempts: int = 0
    next_attempt_at: float = 0.0
    last_error: str = ""

    @property
    def event_id(self) -> str:
        return self.event.id


@dataclass(frozen=True)
class ThreadRef:
    """Where the parent message of an incident lives (Slack channel id and ``ts``)."""

    channel: str
    ts: str


class StateStore(Protocol):
    path: str

    def load(self) -> dict[IncidentKey, Incident]: ...

    def commit(self, incidents: Mapping[IncidentKey, Incident], queued: Iterable[tuple[str, Event]]) -> None: ...

    def due(self, now: float) -> list[OutboxItem]: ...

    def attempt(self, item_id: int) -> None: ...

    def delivered(self, item_id: int) -> None: ...

    def failed(self, item_id: int, next_attempt_at: float, error: str) -> None: ...

    def pending(self) -> int: ...

    def thread(self, uid: str, sink: str) -> ThreadRef | None: ...

    def set_thread(self, uid: str, sink: str, ref: ThreadRef) -> None: ...


class MemoryStore:
    """Everything in dictionaries. Also the write-through cache of :class:`ResilientStore`."""

    def __init__(self, path: str = ":memory:") -> None:
        self.path = path
        self.incidents: dict[IncidentKey, Incident] = {}
        self.outbox: dict[int, OutboxItem] = {}
        self.threads: dict[tuple[str, str], ThreadRef] = {}
        self._next_id = 1

    def load(self) -> dict[IncidentKey, Incident]:
        return dict(self.incidents)

    def enqueue(self, sink: str, event: Event) -> OutboxItem | None:
        if any(i.sink == sink and i.event_id == event.id for i in self.outbox.values()):
            return None  # the same event is never queued twice
        item = OutboxItem(self._next_id, sink, event)
        self._next_id += 1
        self.outbox[item.id] = item
        return item

    def commit(self, incidents: Mapping[IncidentKey, Incident], queued: Iterable[tuple[str, Event]]) -> None:
        self.incidents = dict(incidents)
        for sink, ev in queued:
            self.enqueue(sink, ev)

    def due(self, now: float) -> list[OutboxItem]:
        return sorted((i for i in self.outbox.values() if i.next_attempt_at <= now), key=lambda i: i.id)

    def attempt(self, item_id: int) -> None:
        if item_id in self.outbox:
            self.outbox[item_id] = replace(self.outbox[item_id], attempts=self.outbox[item_id].attempts + 1)

    def delivered(self, item_id: int) -> None:
        self.outbox.pop(item_id, None)

    def failed(self, item_id: int, next_attempt_at: float, error: str) -> None:
        if item_id in self.outbox:
            self.outbox[item_id] = replace(self.outbox[item_id], next_attempt_at=next_attempt_at, last_error=error)

    def pending(self) -> int:
        return len(self.outbox)

    def thread(self, uid: str, sink: str) -> ThreadRef | None:
        return self.threads.get((uid, sink))

    def set_thread(self, uid: str, sink: str, ref: ThreadRef) -> None:
        self.threads[(uid, sink)] = ref


_SCHEMA = """
CREATE TABLE IF NOT EXISTS incidents (key TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (
  id INTEGER PRIMARY KEY, sink TEXT NOT NULL, event_id TEXT NOT NULL, event TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at REAL NOT NULL DEFAULT 0, last_error TEXT NOT NULL DEFAULT '',
  UNIQUE (sink, event_id));
CREATE TABLE IF NOT EXISTS threads (uid TEXT, sink TEXT, channel TEXT, ts TEXT, PRIMARY KEY (uid, sink));
"""


class SqliteStore:
    """The on-disk copy. Every method is one transaction; raises ``sqlite3.Error`` / ``OSError``."""

    def __init__(self, path: str) -> None:
        self.path = path
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
            self._db.execute("SELECT count(*) FROM incidents").fetchone()  # corrupt files fail here

    def _tx(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                out = fn(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return out

    def load_into(self, mem: MemoryStore) -> None:
        rows = self._db.execute("SELECT data FROM incidents").fetchall()
        mem.incidents = {(i := Incident.from_json(json.loads(d))).key: i for (d,) in rows}
        for row in self._db.execute("SELECT id, sink, event, attempts, next_attempt_at, last_error FROM outbox"):
            item = OutboxItem(row[0], row[1], Event.from_json(json.loads(row[2])), row[3], row[4], row[5])
            mem.outbox[item.id] = item
            mem._next_id = max(mem._next_id, item.id + 1)
        for uid, sink, channel, ts in self._db.execute("SELECT uid, sink, channel, ts FROM threads"):
            mem.threads[(uid, sink)] = ThreadRef(channel, ts)

    def commit(self, incidents: Mapping[IncidentKey, Incident], items: Iterable[OutboxItem]) -> None:
        def run(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM incidents")
            db.executemany(
                "INSERT INTO incidents (key, data) VALUES (?, ?)",
                [(str(k), json.dumps(v.to_json())) for k, v in incidents.items()],
            )
            db.executemany(
                "INSERT OR IGNORE INTO outbox (id, sink, event_id, event) VALUES (?, ?, ?, ?)",
                [(i.id, i.sink, i.event_id, json.dumps(i.event.to_json())) for i in items],
            )

        self._tx(run)

    def update_item(self, item: OutboxItem) -> None:
        self._tx(
            lambda db: db.execute(
                "UPDATE outbox SET attempts = ?, next_attempt_at = ?, last_error = ? WHERE id = ?",
                (item.attempts, item.next_attempt_at, item.last_error, item.id),
            )
        )

    def delete_item(self, item_id: int) -> None:
        self._tx(lambda db: db.execute("DELETE FROM outbox WHERE id = ?", (item_id,)))

    def set_thread(self, uid: str, sink: str, ref: ThreadRef) -> None:
        self._tx(
            lambda db: db.execute(
                "INSERT OR REPLACE INTO threads (uid, sink, channel, ts) VALUES (?, ?, ?, ?)",
                (uid, sink, ref.channel, ref.ts),
            )
        )

    def prune_threads(self, keep: set[str]) -> None:
        def run(db: sqlite3.Connection) -> None:
            for (uid,) in db.execute("SELECT DISTINCT uid FROM threads").fetchall():
                if uid not in keep:
                    db.execute("DELETE FROM threads WHERE uid = ?", (uid,))

        self._tx(run)

    def close(self) -> None:
        with self._lock:
            self._db.close()


class ResilientStore(MemoryStore):
    """Memory first, then SQLite write-through. A disk failure degrades to memory, once, with one log line."""

    def __init__(self, path: str, on_error: Callable[[str], None] | None = None) -> None:
        super().__init__(path)
        self._on_error = on_error or (lambda msg: None)
        self.disk: SqliteStore | None = None
        self.error = ""
        try:
            disk = SqliteStore(path)
            disk.load_into(self)
            self.disk = disk
        except (sqlite3.Error, OSError, ValueError, KeyError, TypeError) as exc:
            self._degrade(exc)

    def _degrade(self, exc: BaseException) -> None:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        self.error = f"state file {self.path}: {reason}; keeping state in memory (a restart will forget it)"
        log.error("kvwatch: %s", self.error)
        self._on_error(self.error)
        if self.disk is not None:
            with contextlib.suppress(sqlite3.Error):
                self.disk.close()
        self.disk = None

    def _write(self, fn: Callable[[SqliteStore], None]) -> None:
        if self.disk is None:
            return
        try:
            fn(self.disk)
        except (sqlite3.Error, OSError) as exc:
            self._degrade(exc)

    def commit(self, incidents: Mapping[IncidentKey, Incident], queued: Iterable[tuple[str, Event]]) -> None:
        self.incidents = dict(incidents)
        items = [i for sink, ev in queued if (i := self.enqueue(sink, ev)) is not None]
        self._write(lambda d: d.commit(self.incidents, items))
        live = {inc.uid for inc in self.incidents.values()} | {i.event.incident.uid for i in self.outbox.values()}
        stale = [k for k in self.threads if k[0] not in live]
        if stale:
            for k in stale:
                del self.threads[k]
            self._write(lambda d: d.prune_threads(live))

    def attempt(self, item_id: int) -> None:
        super().attempt(item_id)
        if item_id in self.outbox:
            self._write(lambda d: d.update_item(self.outbox[item_id]))

    def delivered(self, item_id: int) -> None:
        super().delivered(item_id)
        self._write(lambda d: d.delete_item(item_id))

    def failed(self, item_id: int, next_attempt_at: float, error: str) -> None:
        super().failed(item_id, next_attempt_at, error)
        if item_id in self.outbox:
            self._write(lambda d: d.update_item(self.outbox[item_id]))

    def set_thread(self, uid: str, sink: str, ref: ThreadRef) -> None:
        super().set_thread(uid, sink, ref)
        self._write(lambda d: d.set_thread(uid, sink, ref))

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()
            self.disk = None
