"""A firing incident whose signals vanish stays open (issue 11): real Prometheus, replayed lifecycle.

A vLLM engine pinned at 97 % with a queue and preemptions; 50 minutes in, its queue (gauge and
queue-time histogram) and preemption series stop (a relabel rule drops them) while KV stays pinned. Each minute is
evaluated against the real Prometheus and fed to the alert lifecycle, as the service's
cycle does: the `full` incident must fire, stay open through 30 minutes of blindness
(marked blind, never resolved by it), and the target must read `unknown`, not `healthy`.
"""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime

import pytest
from fixtures.core import fleet
from support.prom import backfill, prometheus

from kvwatch.alerting.lifecycle import EventKind, IncidentState, Lifecycle
from kvwatch.config import load_settings
from kvwatch.core.models import FailureMode
from kvwatch.core.pipeline import evaluate
from kvwatch.core.promclient import PromClient
from kvwatch.core.rules import load_ruleset

pytestmark = [pytest.mark.prometheus]

SPAN = 5400.0
CUT = 3000.0  # seconds after the data start: queue and preemption series vanish
# the queue-time histogram goes too: since 76f409d it stands in for the queue gauge (Little's law), and
# with it kept `full` stays decidable (rightly): this test is about a queue kvwatch can no longer see
DROPPED = ("vllm:num_requests_waiting", "vllm:num_requests_waiting_by_reason", "vllm:num_preemptions_total",
           "vllm:request_queue_time_seconds")
_SAMPLE = re.compile(r"^([^{\s#]+)\{.*\} \S+ (\S+)$")


def _history(end: float) -> str:
    fn, engine_labels = fleet.EXPOSITIONS["vllm-0.33"]
    t0 = end - SPAN
    w = fleet._Writer()
    times = [t0 + i * fleet.INTERVAL_S for i in range(int(SPAN // fleet.INTERVAL_S) + 1)]
    base = {"job": "vllm", "instance": "pinned:8000", "engine": "0"}
    base |= {k: v.format(model="m") for k, v in engine_labels.items()}
    fn(fleet._Ctx(w, base, times, t0, fleet.PROFILES["full"], 1.0, 0))
    lines = []
    for line in w.text().splitlines():
        m = _SAMPLE.match(line)
        family = re.sub(r"_(total|bucket|sum|count)$", "", m.group(1)) if m else ""
        if m and family in {d.removesuffix("_total") for d in DROPPED} and float(m.group(2)) > t0 + CUT:
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_firing_incident_stays_open_when_its_signals_vanish(tmp_path) -> None:
    end = math.floor((time.time() - 4 * 3600) / 600) * 600
    backfill(_history(end), tmp_path / "data")
    cut = end - SPAN + CUT
    settings = load_settings(None, environ={})
    rules = load_ruleset()
    life = Lifecycle(settings.lifecycle)
    incidents: dict = {}
    log: list[tuple[float, EventKind]] = []
    states: dict[float, FailureMode] = {}
    with prometheus(tsdb=tmp_path / "data") as url:
        client = PromClient(url)
        # what the service does every cycle: evaluate at the instant, then advance the lifecycle
        for at in range(int(cut - 900), int(end) + 1, 60):
            ev = evaluate(client, settings, rules, datetime.fromtimestamp(at, tz=UTC))
            incidents, events = life.step(incidents, ev.results, float(at))
            log.extend((float(at), e.kind) for e in events if e.incident.mode is FailureMode.FULL)
            (r,) = ev.results
            states[float(at)] = r.state
    assert log[0][1] is EventKind.FIRE and log[0][0] < cut
    assert FailureMode.FULL in {s for t, s in states.items() if t <= cut}
    # once the last queue sample is out of the rule's span, `full` cannot be decided: unknown, never healthy
    late = {s for t, s in states.items() if t >= cut + 600 + 60}
    assert late == {FailureMode.UNKNOWN}, late
    (full,) = [i for i in incidents.values() if i.mode is FailureMode.FULL]
    assert full.state is IncidentState.FIRING and full.blind_since is not None and "waiting" in full.blind_reason
    assert EventKind.BLIND in [k for _, k in log] and EventKind.RESOLVE not in [k for _, k in log], log
