from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from test_lifecycle import FULL_KEY, diag, lc, result

from kvwatch.alerting.lifecycle import EventKind
from kvwatch.alerting.state import ResilientStore, ThreadRef


def _fired():
    return lc().step({}, [result(diag(for_s=0))], 100.0)


def test_restart_keeps_incidents_outbox_and_threads(tmp_path: Path) -> None:
    path = str(tmp_path / "sub" / "state.json")
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


def test_corrupt_file_is_quarantined_with_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Defect 7: a damaged file must be detected (checksum) and moved aside, not trusted or ignored."""
    path = tmp_path / "state.json"
    s1 = ResilientStore(str(path))
    incidents, events = _fired()
    s1.commit(incidents, [("slack", e) for e in events])
    doc = json.loads(path.read_text())
    doc["state"]["incidents"][0]["severity"] = "warning"  # valid JSON, wrong content: only a checksum sees it
    path.write_text(json.dumps(doc))
    errors: list[str] = []
    store = ResilientStore(str(path), on_error=errors.append, clock=lambda: 1234.0)
    assert store.load() == {} and store.pending() == 0
    assert store.quarantined == tmp_path / "state.json.corrupt-1234" and store.quarantined.exists()
    assert len(errors) == 1 and "checksum" in errors[0]
    assert sum("corrupt" in r.message for r in caplog.records) == 1
    store.commit(incidents, [("slack", e) for e in events])  # and a fresh, valid file replaces it
    assert ResilientStore(str(path)).load() == incidents
    garbage = tmp_path / "g.json"
    garbage.write_bytes(b"this is not a state file" * 100)
    assert ResilientStore(str(garbage)).quarantined is not None


def test_unwritable_path_is_reported_at_start(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")  # a file where the directory should be: fails even for root
    store = ResilientStore(str(blocker / "state.json"))
    assert not store.disk and str(blocker / "state.json") in store.error


def test_write_failure_continues_in_memory_and_retries_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect 6/7: one line and a count per failure, memory keeps working, and the file is
    retried so a restart does not bring back a stale file once the disk is writable again."""
    d = tmp_path / "ro"
    d.mkdir()
    path = d / "state.json"
    errors: list[str] = []
    store = ResilientStore(str(path), on_error=errors.append)
    assert store.disk
    blocked = path.with_name(f".{path.name}.tmp")
    blocked.mkdir()  # the temporary file cannot be created: every write fails (also as root)
    incidents, events = _fired()
    store.commit(incidents, [("slack", e) for e in events])
    store.attempt(store.due(1e9)[0].id)
    assert not store.disk and len(errors) == 2 and "state.json" in errors[0]
    assert sum("keeping state in memory" in r.message for r in caplog.records) == 1  # one line, not one per write
    assert store.pending() == 1 and store.load() == incidents
    assert ResilientStore(str(path)).load() == {}  # the file still holds the old state ...
    blocked.rmdir()
    store.delivered(store.due(1e9)[0].id)  # ... until the next change writes it
    assert store.disk and "written again" in caplog.text
    again = ResilientStore(str(path))
    assert again.load() == incidents and again.pending() == 0
    os.chmod(d, stat.S_IRWXU)


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
