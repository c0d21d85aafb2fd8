from __future__ import annotations

from kvwatch.alerting.lifecycle import (
    EventKind,
    Incident,
    IncidentKey,
    IncidentState,
    Lifecycle,
    open_counts,
)
from kvwatch.config import LifecycleSettings, Silence
from kvwatch.core.models import (
    Diagnosis,
    Evidence,
    FailureMode,
    ModeVerdict,
    Severity,
    Target,
    TargetKey,
    TargetResult,
    Verdict,
)

T = Target(TargetKey("vllm", "10.0.0.1:8000"), dialect="vllm-v1", engine="vllm", model="llama")
FULL_KEY = IncidentKey("vllm", "10.0.0.1:8000")  # one incident per engine, whatever its mode


def diag(mode: FailureMode = FailureMode.FULL, sev: Severity = Severity.CRITICAL, for_s: float = 60.0) -> Diagnosis:
    ev = (Evidence("kv_usage", "mean", 0.97, ">=", 0.9, "10m", True),)
    return Diagnosis(mode, f"{mode.value}-rule", sev, 0.9, f"{mode.value} summary", ev, ("one", "two"), for_s=for_s)


def result(*diags: Diagnosis, state: FailureMode | None = None, target: Target = T) -> TargetResult:
    if not diags:
        diags = (Diagnosis(FailureMode.HEALTHY, "healthy", Severity.INFO, 0.9, "ok", (), ("nothing",)),)
    return TargetResult(target, state or diags[0].mode, diags, ())


def unknown() -> TargetResult:
    d = Diagnosis(FailureMode.UNKNOWN, "blind-spot", Severity.WARNING, 1.0, "blind", (), ("check",))
    return TargetResult(T, FailureMode.UNKNOWN, (d,), ("kv_usage",))


def lc(**kw: object) -> Lifecycle:
    # blind notices at once unless a test says otherwise (the delay has tests of its own)
    base = {"hold_down": 120.0, "reminder_interval": 0.0, "blind_spot_for": 300.0, "blind_notice_after": 0.0}
    base.update(kw)
    return Lifecycle(LifecycleSettings(**base))


def run(life: Lifecycle, seq: list[tuple[float, list[TargetResult]]], **kw: bool):
    incidents: dict[IncidentKey, Incident] = {}
    log = []
    for now, results in seq:
        incidents, events = life.step(incidents, results, now, **kw)
        log.extend((now, e.kind) for e in events)
    return incidents, log


def test_pending_then_fires_after_pending_for_once_only() -> None:
    life = lc(pending_for=60)
    seq = [(t, [result(diag(for_s=600))]) for t in (0, 30, 59, 60, 90, 120)]
    incidents, log = run(life, seq)
    assert log == [(60, EventKind.FIRE)]
    inc = incidents[FULL_KEY]
    assert inc.state is IncidentState.FIRING and inc.fired_at == 60 and inc.started_at == 0
    assert dict(inc.labels)["engine"] == "vllm" and dict(inc.labels)["model"] == "llama"


def test_rule_for_is_not_counted_twice() -> None:
    # the rule's `for` was already verified over the evaluation window: fire on first match
    _, log = run(lc(), [(t, [result(diag(for_s=600))]) for t in (0, 30)])
    assert log == [(0, EventKind.FIRE)]
    _, log = run(lc(pending_for=30), [(t, [result(diag(for_s=600))]) for t in (0, 29, 30)])
    assert log == [(30, EventKind.FIRE)]


def test_pending_that_clears_is_forgotten_silently() -> None:
    incidents, log = run(lc(pending_for=60), [(0, [result(diag())]), (30, [result()]), (200, [result()])])
    assert log == [] and incidents == {}


def test_assume_held_fires_at_once() -> None:
    incidents, log = run(lc(pending_for=600), [(1000, [result(diag(for_s=600))])], assume_held=True)
    assert log == [(1000, EventKind.FIRE)]
    assert incidents[FULL_KEY].started_at == 400


def test_hold_down_prevents_flapping_and_resolves_later() -> None:
    firing, clear = [result(diag(for_s=0))], [result()]
    seq = [(0, firing), (10, clear), (60, firing), (70, clear), (150, clear), (179, clear), (181, clear)]
    incidents, log = run(lc(hold_down=120), seq)
    # clear since it was last seen at 60 → resolves at the first cycle ≥ 180
    assert log == [(0, EventKind.FIRE), (181, EventKind.RESOLVE)]
    assert FULL_KEY in incidents and incidents[FULL_KEY].state is IncidentState.RESOLVED
    # a resolved incident is dropped on the next step; a recurrence is a new incident and fires again
    inc2, ev = lc().step(incidents, firing, 300)
    assert [e.kind for e in ev] == [EventKind.FIRE] and inc2[FULL_KEY].started_at == 300


def test_escalation_updates_and_reminders() -> None:
    warn, crit = result(diag(sev=Severity.WARNING, for_s=0)), result(diag(sev=Severity.CRITICAL, for_s=0))
    seq = [(0, [warn]), (50, [crit]), (60, [warn]), (100, [crit]), (150, [warn]), (160, [warn])]
    _, log = run(lc(reminder_interval=100), seq)
    # escalation once; a downgrade and a re-escalation to the already notified severity say nothing
    assert log == [(0, EventKind.FIRE), (50, EventKind.UPDATE), (150, EventKind.REMIND)]


def test_blind_target_freezes_open_incidents() -> None:
    firing = [result(diag(for_s=0))]
    seq = [(0, firing), (100, [unknown()]), (500, [unknown()]), (1000, [unknown()]), (1100, firing)]
    incidents, log = run(lc(hold_down=60, blind_spot_for=300), seq)
    # the full incident neither resolves nor re-fires; the blind spot itself fires after blind_spot_for
    assert (0, EventKind.FIRE) in log
    assert not any(k is EventKind.RESOLVE and t < 1100 for t, k in log if t)
    assert incidents[FULL_KEY].state is IncidentState.FIRING and incidents[FULL_KEY].mode is FailureMode.FULL
    # the engine's one incident stays open, marked blind once: no second (blind-spot) incident for it
    assert log == [(0, EventKind.FIRE), (100, EventKind.BLIND)]
    assert incidents[FULL_KEY].blind_since is None  # data is back


def test_forget_after_expires_blind_incidents() -> None:
    seq = [(0, [result(diag(for_s=0))]), (500, [unknown()]), (1000, [unknown()])]
    incidents, log = run(lc(forget_after=1000), seq)
    assert log == [(0, EventKind.FIRE), (500, EventKind.BLIND), (1000, EventKind.RESOLVE)]
    assert incidents[FULL_KEY].resolution == "expired"


def test_silence_suppresses_events_but_tracks() -> None:
    sil = Silence(matchers={"instance": "10.0.0.1:8000", "mode": "full"}, until="2100-01-01T00:00:00Z")
    incidents, log = run(lc(silences=(sil,)), [(0, [result(diag(for_s=0))]), (10, [result(diag(for_s=0))])])
    assert log == [] and incidents[FULL_KEY].state is IncidentState.FIRING and incidents[FULL_KEY].silenced
    expired = Silence(matchers={"mode": "full"}, until="2000-01-01T00:00:00Z")
    now = 1.9e9  # 2030
    _, log2 = run(lc(silences=(expired,)), [(now, [result(diag(for_s=0))])])
    assert log2 == [(now, EventKind.FIRE)]
    other = Silence(matchers={"mode": "idle"})
    _, log3 = run(lc(silences=(other,)), [(0, [result(diag(for_s=0))])])
    assert log3 == [(0, EventKind.FIRE)]


def test_info_and_healthy_are_not_incidents() -> None:
    info = diag(mode=FailureMode.IDLE, sev=Severity.INFO, for_s=0)
    incidents, log = run(lc(), [(0, [result(info)]), (10, [result()])])
    assert incidents == {} and log == []


def test_incident_json_roundtrip_and_counts() -> None:
    incidents, _ = run(lc(), [(0, [result(diag(for_s=0))])])
    inc = incidents[FULL_KEY]
    assert Incident.from_json(inc.to_json()) == inc
    assert open_counts(incidents) == {("full", "critical"): 1}
    assert IncidentKey.from_json(FULL_KEY.to_json()) == FULL_KEY


def blind_full(state: FailureMode = FailureMode.UNKNOWN) -> TargetResult:
    """The target is still scraped but the signals that decide `full` vanished (issue 11)."""
    d = Diagnosis(FailureMode.UNKNOWN, "undecidable", Severity.WARNING, 1.0, "full undecidable", (), ("check",))
    modes = (ModeVerdict(FailureMode.FULL, Verdict.UNDECIDABLE, ("full-rule",), ("preemptions", "waiting"), True),)
    return TargetResult(T, state, (d,), ("waiting", "preemptions"), modes=modes, blocking=("preemptions", "waiting"))


def test_firing_incident_whose_signals_vanish_stays_open_marked_blind() -> None:
    firing = [result(diag(for_s=0))]
    healthy = [result()]
    seq = [(0, firing), (60, [blind_full()]), (600, [blind_full()]), (5000, [blind_full()]), (5060, healthy),
           (5100, healthy), (5200, healthy)]
    life = lc(hold_down=120, forget_after=1000)
    incidents: dict[IncidentKey, Incident] = {}
    log = []
    for now, results in seq:
        incidents, events = life.step(incidents, results, now)
        log.extend((now, e.kind) for e in events if e.incident.key == FULL_KEY)
        if now == 600:
            held = incidents[FULL_KEY]
            assert held.state is IncidentState.FIRING and held.blind_since == 60
            assert "preemptions, waiting" in held.blind_reason
            assert Incident.from_json(held.to_json()) == held  # survives the state file
    # one blind event, no resolve while blind (not after hold_down, not after forget_after) ...
    assert log[:2] == [(0, EventKind.FIRE), (60, EventKind.BLIND)]
    # (one incident per engine: the blindness does not open a second, `unknown` incident)
    assert not any(k is EventKind.RESOLVE and t < 5200 for t, k in log)
    # ... and the hold-down counts from the signals' return (5060), not from before the blindness
    assert (5200, EventKind.RESOLVE) in log and incidents[FULL_KEY].resolution == "cleared"


def test_blind_incident_shows_in_slack_text_and_alertmanager() -> None:
    from kvwatch.alerting.sinks import blocks
    from kvwatch.alerting.sinks.alertmanager import to_alert
    from kvwatch.config import load_settings

    life = lc()
    incidents, _ = life.step({}, [result(diag(for_s=0))], 0)
    incidents, events = life.step(incidents, [blind_full()], 60)
    inc = incidents[FULL_KEY]
    assert [e.kind for e in events] == [EventKind.BLIND]
    assert "Signals lost (missing: preemptions, waiting)" in blocks.reply_text(events[0])
    assert "BLIND" in blocks.status_line(inc, 120)
    alert = to_alert(load_settings(None, environ={}), inc, 120)
    assert "held open until the signals return" in alert["annotations"]["blind"]


# ---- issue 17: one incident per engine episode; gone is not blind; identity is structured ------

GONE = Target(TargetKey("vllm", "10.0.0.1:8000"), dialect="stale", engine="unknown", gone=True)


def gone() -> TargetResult:
    d = Diagnosis(FailureMode.UNKNOWN, "blind-spot", Severity.WARNING, 1.0, "no data now", (), ("check",))
    return TargetResult(GONE, FailureMode.UNKNOWN, (d,), ("kv_usage",))


def test_one_incident_per_engine_with_co_findings() -> None:
    """Defect 1: a replica FULL and MISREAD at once opened two parents; now one, MISREAD a co-finding."""
    both = [result(diag(FailureMode.FULL, Severity.CRITICAL, 0), diag(FailureMode.MISREAD, Severity.WARNING, 0))]
    incidents, log = run(lc(), [(0, both)])
    assert list(incidents) == [FULL_KEY] and log == [(0, EventKind.FIRE)]
    inc = incidents[FULL_KEY]
    assert inc.mode is FailureMode.FULL and [f.mode for f in inc.findings] == [FailureMode.FULL, FailureMode.MISREAD]


def test_mode_change_is_an_update_of_the_same_episode() -> None:
    """Defect 1: oscillating → full opened a second thread; now one episode, one update per change."""
    osc = [result(diag(FailureMode.OSCILLATING, Severity.WARNING, 0))]
    full = [result(diag(FailureMode.FULL, Severity.CRITICAL, 0))]
    seq = [(0, osc), (10, full), (20, full), (30, osc), (40, [result()]), (200, [result()])]
    life = lc(hold_down=100)
    incidents: dict[IncidentKey, Incident] = {}
    events = []
    for now, res in seq:
        incidents, ev = life.step(incidents, res, now)
        events += ev
    assert [(e.at, e.kind) for e in events] == [(0, EventKind.FIRE), (10, EventKind.UPDATE), (30, EventKind.UPDATE),
                                                 (200, EventKind.RESOLVE)]
    assert len({e.incident.uid for e in events}) == 1  # one thread for the whole episode
    assert events[1].changes[:2] == ("mode oscillating → full", "severity warning → critical")
    assert events[2].changes == ("mode full → oscillating",) and events[2].previous_mode is FailureMode.FULL


def test_new_co_finding_is_announced_once() -> None:
    full = diag(FailureMode.FULL, Severity.CRITICAL, 0)
    mis = diag(FailureMode.MISREAD, Severity.WARNING, 0)
    seq = [(0, [result(full)]), (10, [result(full, mis)]), (20, [result(full)]), (30, [result(full, mis)])]
    _, log = run(lc(), seq)
    assert log == [(0, EventKind.FIRE), (10, EventKind.UPDATE)]


def test_gone_target_resolves_quietly_as_gone_and_opens_nothing() -> None:
    """Defect 4: a rolled pod became `unknown`, fired a blind-spot warning and stayed open for a day."""
    seq = [(0, [result(diag(for_s=0))]), (10, [gone()]), (200, [gone()]), (2000, [gone()])]
    incidents, log = run(lc(hold_down=120, blind_spot_for=300), seq)
    assert log == [(200, EventKind.RESOLVE)] or log == [(0, EventKind.FIRE), (200, EventKind.RESOLVE)]
    assert log[0] == (0, EventKind.FIRE) and log[-1] == (200, EventKind.RESOLVE)
    # after the resolve nothing else, and a gone target never becomes a blind-spot incident
    assert incidents == {}
    never, log2 = run(lc(blind_spot_for=300), [(t, [gone()]) for t in (0, 400, 800)])
    assert never == {} and log2 == []


def test_present_but_blind_is_not_gone() -> None:
    incidents, log = run(lc(hold_down=120), [(0, [result(diag(for_s=0))]), (10, [unknown()]), (500, [unknown()])])
    assert log == [(0, EventKind.FIRE), (10, EventKind.BLIND)]
    assert incidents[FULL_KEY].state is IncidentState.FIRING and incidents[FULL_KEY].blind_since == 10


def test_one_empty_cycle_before_a_rollout_says_nothing() -> None:
    """A pod leaving in a rollout can read "no data" for one cycle before it reads gone: with the
    default settings the incident is held open at once but its thread hears nothing until the
    blindness has lasted ``blind_notice_after``; gone first, it resolves quietly."""
    life = Lifecycle(LifecycleSettings(reminder_interval=0.0))
    assert life.config.blind_notice_after > 60  # longer than one service cycle
    seq = [(0, [result(diag(for_s=0))]), (60, [unknown()]), (120, [gone()]), (120 + life.config.hold_down, [gone()])]
    incidents, log = run(life, seq)
    assert log == [(0, EventKind.FIRE), (120 + life.config.hold_down, EventKind.RESOLVE)]
    assert incidents[FULL_KEY].resolution == "gone"


def test_lasting_blindness_is_announced_once_after_the_notice_delay() -> None:
    life = lc(hold_down=60, blind_notice_after=120)
    seq = [(0, [result(diag(for_s=0))]), *[(t, [blind_full()]) for t in (60, 120, 179, 180, 240, 600)]]
    incidents: dict[IncidentKey, Incident] = {}
    log = []
    for now, results in seq:
        incidents, events = life.step(incidents, results, now)
        log.extend((now, e.kind) for e in events)
        if now == 60:  # held open, frozen, from the first blind cycle
            assert incidents[FULL_KEY].blind_since == 60 and incidents[FULL_KEY].state is IncidentState.FIRING
        held = incidents[FULL_KEY]
        assert Incident.from_json(held.to_json()) == held  # the pending notice survives a restart
    assert log == [(0, EventKind.FIRE), (180, EventKind.BLIND)]


def test_signals_back_before_the_notice_say_nothing() -> None:
    firing = [result(diag(for_s=0))]
    incidents, log = run(lc(blind_notice_after=120), [(0, firing), (60, [blind_full()]), (120, firing),
                                                       (200, [blind_full()]), (260, firing)])
    assert log == [(0, EventKind.FIRE)]
    assert incidents[FULL_KEY].blind_since is None and incidents[FULL_KEY].state is IncidentState.FIRING


def test_a_blindness_announced_before_the_upgrade_is_not_announced_again() -> None:
    """State written before ``blind_notice_after`` existed announced blindness at once."""
    life = lc(blind_notice_after=120)
    incidents, _ = life.step({}, [result(diag(for_s=0))], 0)
    incidents, _ = life.step(incidents, [blind_full()], 60)
    old = incidents[FULL_KEY].to_json()
    old.pop("blind_announced", None)
    restored = {FULL_KEY: Incident.from_json(old)}
    _, events = life.step(restored, [blind_full()], 600)
    assert events == []


def test_absent_from_results_is_gone() -> None:
    incidents, log = run(lc(hold_down=100), [(0, [result(diag(for_s=0))]), (50, []), (100, [])])
    assert log == [(0, EventKind.FIRE), (100, EventKind.RESOLVE)] and incidents[FULL_KEY].resolution == "gone"


def test_identity_survives_slashes_in_job() -> None:
    """Defect 2: `job="ns/name"` (Prometheus Operator) was split on "/" after a restart."""
    op = Target(TargetKey("llm/vllm-llama", "10.1.2.3:8000"), dialect="vllm-v1", engine="vllm", model="llama")
    incidents, _ = run(lc(), [(0, [result(diag(for_s=0), target=op)])])
    (key,) = incidents
    back = Incident.from_json(incidents[key].to_json())
    assert back == incidents[key] and back.key == IncidentKey("llm/vllm-llama", "10.1.2.3:8000")
    again, ev = lc().step({back.key: back}, [result(diag(for_s=0), target=op)], 10)
    assert ev == [] and again[key].uid == incidents[key].uid
