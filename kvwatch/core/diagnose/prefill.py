"""The admission queue behind a waiting gauge that also counts requests in prefill.

The Dynamo frontend's ``queued_requests`` holds every HTTP request from its arrival until
its first token, prefill included (ai-dynamo/dynamo ``lib/llm/src/http/service/metrics.rs``).
By Little's law it then averages request rate × mean TTFT with nobody queued: 3.6 at
12 requests/s and 0.3 s to the first token, a count the rules would read as a persistent
queue. The rules speak of requests *held back from admission*, so for such a gauge kvwatch
reads only the part a within-SLO prefill cannot hold::

    m = request_rate × ttft_slo
    waiting = max(0, queued − max(1, m + 2·√m))

Within the SLO the frontend holds at most ``m`` requests on average; more means requests
spend longer than the SLO before their first token (an admission queue, or a prefill slower
than the SLO: the frontend alone cannot tell which, the other signals can). A scrape sees a
count, not the average: arrivals are Poisson-like, so two standard deviations (``2·√m``)
above ``m`` are still a within-SLO prefill (a long-prompt slice in prefill read as a queue
kept a recovered oscillation alive, rnd-12-070). One request before its first token is
never a queue. Without a request rate (no counter, or a gap) only that one request is
taken off. Other engines' waiting gauges exclude requests in prefill and are left as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from kvwatch.core.dialects import waiting_counts_prefill
from kvwatch.core.frame import FleetData
from kvwatch.core.models import Target
from kvwatch.core.signals import Signal

#: standard deviations of one scrape's Poisson count above the Little's-law mean still read as prefill
PREFILL_SD = 2.0
#: requests before their first token that are never a queue, whatever the rate
MIN_HELD = 1.0


def admission_queue(data: FleetData, targets: Iterable[Target], ttft_slo_s: float) -> FleetData:
    """``data`` with the waiting gauge of prefill-counting dialects read as the admission
    queue (above). A shallow copy when anything changes: ``data`` itself, which the service
    keeps between cycles, is never modified; ``data`` unchanged when no target needs it."""
    series = None
    for t in targets:
        if not waiting_counts_prefill(t.dialect):
            continue
        rows = data.series.get(t.key, {})
        raw = rows.get(Signal.WAITING)
        if raw is None:
            continue
        queued = np.asarray(raw, dtype=float)
        rate = rows.get(Signal.REQUEST_RATE)
        # a gap, ±Inf or a negative rate (a counter reset read client-side) says nothing: one request off
        finite = np.zeros_like(queued) if rate is None else np.nan_to_num(
            np.asarray(rate, dtype=float), nan=0.0, posinf=0.0, neginf=0.0)
        m = np.fmax(finite * ttft_slo_s, 0.0)
        held = np.fmax(m + PREFILL_SD * np.sqrt(m), MIN_HELD)
        if series is None:
            series = dict(data.series)
        # NaN stays NaN (a gap in the gauge); a gap in the rate takes off one request only
        series[t.key] = {**rows, Signal.WAITING: np.maximum(queued - held, 0.0, where=~np.isnan(queued),
                                                           out=np.full_like(queued, np.nan))}
    return data if series is None else dataclasses.replace(data, series=series)
