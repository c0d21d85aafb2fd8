"""A PNG chart of an incident (KV usage, waiting, preemptions) for the Slack thread. Needs matplotlib.

Queries Prometheus with the target's own dialect over the incident plus a margin.
Returns ``None`` when nothing could be plotted; callers treat charts as optional.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import UTC, datetime

# Figure without pyplot: no global backend state, safe in a worker thread, no display needed
from matplotlib.figure import Figure

from kvwatch.alerting.lifecycle import Incident
from kvwatch.alerting.sinks.links import MARGIN_S
from kvwatch.config import Settings
from kvwatch.core.dialects import DIALECT_BY_ID
from kvwatch.core.promclient import QueryClient
from kvwatch.core.selector import target_matchers
from kvwatch.core.signals import Signal
from kvwatch.durations import format_duration

PANELS = ((Signal.KV_USAGE, "KV usage (0-1)"), (Signal.WAITING, "waiting requests"), (Signal.PREEMPTIONS, "preemptions/s"))


def _series(client: QueryClient, query: str, start: float, end: float, step: float) -> tuple[list[datetime], list[float]]:
    rows = client.range(query, datetime.fromtimestamp(start, tz=UTC), datetime.fromtimestamp(end, tz=UTC), step)
    if not rows:
        return [], []
    values = rows[0].get("values", [])
    return ([datetime.fromtimestamp(float(t), tz=UTC) for t, _ in values], [float(v) for _, v in values])


def render_png(settings: Settings, client: QueryClient, inc: Incident, now: float) -> bytes | None:
    labels = inc.label_map
    dialect = DIALECT_BY_ID.get(labels.get("dialect", ""))
    if dialect is None:
        return None
    user = target_matchers(labels.get("job", ""), labels.get("instance", ""))
    start, end = inc.started_at - MARGIN_S, inc.resolved_at or now
    step = max(settings.evaluation.step, (end - start) / 300)
    rw = format_duration(settings.evaluation.rate_window)
    fig = Figure(figsize=(8, 6))
    axes = fig.subplots(len(PANELS), 1, sharex=True)
    plotted = 0
    for ax, (sig, title) in zip(axes, PANELS, strict=True):
        sources = dialect.sources.get(sig, ())
        if sources:
            query = " or ".join(src.promql(user, rw) for src in sources)
            xs, ys = _series(client, query, start, end, step)
            if xs:
                ax.plot(xs, ys, linewidth=1.2)
                plotted += 1
        ax.set_ylabel(title, fontsize=8)
        ax.axvline(datetime.fromtimestamp(inc.started_at, tz=UTC), color="red", linestyle="--", linewidth=0.8)
    axes[0].set_title(f"{inc.key.job}/{inc.key.instance}: {inc.mode.value}", fontsize=10)
    if not plotted:
        return None
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    return buf.getvalue()


def chart_maker(settings: Settings, client: QueryClient) -> Callable[[Incident, float], bytes | None]:
    return lambda inc, now: render_png(settings, client, inc, now)
