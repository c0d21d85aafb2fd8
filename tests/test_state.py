from __future__ import annotations

from pathlib import Path

import pytest
from test_lifecycle import FULL_KEY, diag, lc, result

from kvwatch.alerting.lifecycle import EventKind
from kvwatch.alerting.state import ResilientStore, ThreadRef


def _fired():
    return lc().step({}, [result(diag(for_s=0))], 100.0)


def test_restart_keeps_incidents_outbox_and_threads(tmp_path: Path) -> None:
    path = str(tmp_path / "sub" / "state.db")
    incidents, events = _fired()
    s1 = ResilientStore(path)
    s1.commit(incidents, [("slack", e) for e in events] + [("console", e) for e in events])
    s1.commit(incidents, [("slack", e) for e in events])  # same event again: not queued twice
    assert s1.pending() == 2
    first = s1.due(100.0)[0]
    s1.attempt(first.id)
    s1.failed(first.id, 160.0, "HTTP 500")
    s1.set_thread(incidents[FULL_KEY].uid, "slack", ThreadRef("C1", "123.456"))
    s1.delivered(s1.due(100.0)[0].id)  # console item (slack one is not due before 160)
    s1.close()

    s2 = ResilientStore(path)
    assert s2.error == ""
    assert s2.load() == incidents
    assert s2.pending() == 1 and s2.due(150.0) == []
    item = s2.due(160.0)[0]
    assert (item.sink, item.attempts, item.last_error, item.event.kind) == ("slack", 1, "HTTP 500", EventKind.FIRE)
    assert item.event == events[0]
    assert s2.thread(incidents[FULL_KEY].uid, "slack") == ThreadRef("C1", "123.456")
    # items queued after a restart do not collide with the surviving ones
    inc2, ev2 = lc(hold_down=0).step(incidents, [result()], 200.0)
    s2.commit(inc2, [("slack", e) for e in ev2])
    s2.close()
    kinds = [i.event.kind for i in ResilientStore(path).due(1e9)]
    assert kinds == [EventKind.FIRE, EventKind.RESOLVE]


def test_corrupt_file_degrades_to_memory_with_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = tmp_path / "state.db"
    bad.write_bytes(b"this is not a database" * 100)
    errors: list[str] = []
    store = ResilientStore(str(bad), on_error=errors.append)
    assert store.disk is None and len(errors) == 1 and str(bad) in errors[0]
    assert str(bad) in caplog.text
    incidents, events = _fired()
    store.commit(incidents, [("slack", e) for e in events])  # keeps working in memory
    assert store.load() == incidents and store.pending() == 1


def test_unwritable_path(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")  # a file where the directory should be: fails even for root
    store = ResilientStore(str(blocker / "state.db"))
    assert store.disk is None and str(blocker / "state.db") in store.error


def test_write_failure_midway_degrades(tmp_path: Path) -> None:
    errors: list[str] = []
    store = ResilientStore(str(tmp_path / "s.db"), on_error=errors.append)
    assert store.disk is not None
    store.disk._db.close()  # simulate the disk going away under us
    incidents, events = _fired()
    store.commit(incidents, [("slack", e) for e in events])
    assert store.disk is None and len(errors) == 1 and "s.db" in errors[0]
    assert store.pending() == 1


def test_state_written_before_the_event_emitted_rename_still_loads() -> None:
    """Old state files name the fields last_notified_at / notified_severity: a restart
    after the upgrade must still know which incidents had a fire event (so they resolve)."""
    incidents, _ = _fired()
    inc = incidents[FULL_KEY]
    assert inc.event_emitted and inc.last_event_at == 100.0
    old = inc.to_json()
    old["last_notified_at"] = old.pop("last_event_at")
    old["notified_severity"] = old.pop("event_severity")
    assert type(inc).from_json(old) == inc
    _, events = lc(hold_down=0).step({FULL_KEY: type(inc).from_json(old)}, [result()], 200.0)
    assert [e.kind for e in events] == [EventKind.RESOLVE]
