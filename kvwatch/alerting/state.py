"""Persistent state: open incidents, the delivery outbox and Slack thread references.

The in-process copy (:class:`MemoryStore`) is the source of truth while kvwatch
runs. :class:`ResilientStore` writes the whole state after every change as one
JSON document with a SHA-256 checksum, atomically (temporary file, ``fsync``,
``rename``): a crash leaves either the old or the new file, never half of one.

* A corrupt file (bad checksum, unreadable JSON, a record this version cannot
  read) is *quarantined*: renamed to ``<path>.corrupt-<unix time>`` with one log
  line, and kvwatch starts empty. Slack threads are then found again through the
  message metadata (see :mod:`kvwatch.alerting.sinks.slack`), so no parent is re-posted.
* An unwritable file or directory (read-only, disk full, permissions) gives one
  log line, ``kvwatch_state_errors_total`` +1, and kvwatch carries on in memory;
  every later change retries the file, and one line says when it is written again.

Delivery is idempotent per item: ``attempt`` (the intent) is written *before* the
HTTP call and ``delivered`` after it; an item found with attempts after a crash is
reconciled by the sink before it posts again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from kvwatch.alerting.lifecycle import Event, Incident, IncidentKey

log = logging.getLogger("kvwatch.alerting.state")

FORMAT = "kvwatch-state/2"


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

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "sink": self.sink, "event": self.event.to_json(), "attempts": self.attempts,
                "next_attempt_at": self.next_attempt_at, "last_error": self.last_error}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> OutboxItem:
        return cls(int(d["id"]), str(d["sink"]), Event.from_json(d["event"]), int(d["attempts"]),
                   float(d["next_attempt_at"]), str(d["last_error"]))


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
    """Everything in dictionaries. Also the in-memory copy of :class:`ResilientStore`."""

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
        live = {inc.uid for inc in self.incidents.values()} | {i.event.incident.uid for i in self.outbox.values()}
        for k in [k for k in self.threads if k[0] not in live]:
            del self.threads[k]
        self._changed()

    def due(self, now: float) -> list[OutboxItem]:
        return sorted((i for i in self.outbox.values() if i.next_attempt_at <= now), key=lambda i: i.id)

    def attempt(self, item_id: int) -> None:
        if item_id in self.outbox:
            self.outbox[item_id] = replace(self.outbox[item_id], attempts=self.outbox[item_id].attempts + 1)
            self._changed()

    def delivered(self, item_id: int) -> None:
        if self.outbox.pop(item_id, None) is not None:
            self._changed()

    def failed(self, item_id: int, next_attempt_at: float, error: str) -> None:
        if item_id in self.outbox:
            self.outbox[item_id] = replace(self.outbox[item_id], next_attempt_at=next_attempt_at, last_error=error)
            self._changed()

    def pending(self) -> int:
        return len(self.outbox)

    def thread(self, uid: str, sink: str) -> ThreadRef | None:
        return self.threads.get((uid, sink))

    def set_thread(self, uid: str, sink: str, ref: ThreadRef) -> None:
        self.threads[(uid, sink)] = ref
        self._changed()

    def _changed(self) -> None:
        """Hook: a persistent store writes itself here."""

    def close(self) -> None:
        """Nothing to release in memory."""

    # ---- the document ---------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "incidents": [inc.to_json() for inc in self.incidents.values()],
            "outbox": [i.to_json() for i in sorted(self.outbox.values(), key=lambda i: i.id)],
            "threads": [{"uid": u, "sink": s, "channel": r.channel, "ts": r.ts} for (u, s), r in self.threads.items()],
            "next_id": self._next_id,
        }

    def restore(self, doc: Mapping[str, Any]) -> None:
        """Replace the contents with ``doc``. Raises KeyError / ValueError / TypeError when malformed."""
        incidents = [Incident.from_json(d) for d in doc["incidents"]]
        outbox = [OutboxItem.from_json(d) for d in doc["outbox"]]
        threads = {(str(t["uid"]), str(t["sink"])): ThreadRef(str(t["channel"]), str(t["ts"])) for t in doc["threads"]}
        self.incidents = {i.key: i for i in incidents}
        self.outbox = {i.id: i for i in outbox}
        self.threads = threads
        self._next_id = max([int(doc["next_id"]), *(i.id + 1 for i in outbox)])


def encode(doc: Mapping[str, Any]) -> bytes:
    body = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(body.encode()).hexdigest()
    return json.dumps({"format": FORMAT, "sha256": digest, "state": json.loads(body)}).encode()


def decode(raw: bytes) -> dict[str, Any]:
    """The state document inside ``raw``; ValueError naming what is wrong when it does not verify."""
    try:
        outer = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a kvwatch state file ({exc})") from None
    if not isinstance(outer, dict) or outer.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} document")
    body = json.dumps(outer.get("state"), sort_keys=True, separators=(",", ":"))
    if hashlib.sha256(body.encode()).hexdigest() != outer.get("sha256"):
        raise ValueError("checksum mismatch (the file was modified or damaged)")
    state = outer["state"]
    if not isinstance(state, dict):
        raise ValueError("state is not an object")
    return state


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file, fsync and rename. Raises OSError."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class ResilientStore(MemoryStore):
    """Memory first, the file after every change. Never raises for file problems (see module doc)."""

    def __init__(self, path: str, on_error: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(path)
        self._on_error = on_error or (lambda msg: None)
        self._clock = clock
        self.file = Path(path)
        #: the last file problem ("" while the file is in step with memory)
        self.error = ""
        #: where a corrupt file was moved (None: nothing quarantined)
        self.quarantined: Path | None = None
        self._load()
        if not self.file.exists():
            self._changed()  # say now, not at the first incident, when the path cannot be written

    def _fail(self, what: str, exc: BaseException | str) -> None:
        reason = exc if isinstance(exc, str) else (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__)
        msg = f"state file {self.path}: {what}: {reason}"
        first = not self.error
        self.error = msg
        if first:
            log.error("kvwatch: %s; keeping state in memory, retrying the file on every change", msg)
        self._on_error(msg)

    def _load(self) -> None:
        try:
            raw = self.file.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            self._fail("cannot read", exc)
            return
        try:
            self.restore(decode(raw))
        except (ValueError, KeyError, TypeError) as exc:
            dest = self.file.with_name(f"{self.file.name}.corrupt-{int(self._clock())}")
            try:
                os.replace(self.file, dest)
                self.quarantined = dest
                where = f"moved to {dest}"
            except OSError as mv:
                where = f"could not be moved aside ({mv.strerror or mv})"
            self.incidents, self.outbox, self.threads = {}, {}, {}
            log.error("kvwatch: state file %s is corrupt (%s); %s; starting empty, Slack threads are looked up "
                      "before posting", self.path, exc, where)
            self._on_error(f"state file {self.path}: corrupt: {exc}")

    def _changed(self) -> None:
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.file, encode(self.to_json()))
        except OSError as exc:
            self._fail("cannot write", exc)
            return
        if self.error:
            log.warning("kvwatch: state file %s written again; it is in step with memory", self.path)
            self.error = ""

    @property
    def disk(self) -> bool:
        """True while the file holds the current state."""
        return not self.error
