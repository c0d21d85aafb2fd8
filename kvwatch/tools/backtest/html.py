"""A self-contained HTML report: per target, KV usage / waiting / preemptions with the state timeline as bands.

Charts are matplotlib PNGs embedded as base64 (no external files or scripts),
rendered with the non-interactive Agg backend. Targets with incidents or
non-healthy states come first; at most ``max_targets`` are charted so a large
fleet still gives a file a browser opens quickly (the rest are listed).
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from kvwatch.core.models import FailureMode
from kvwatch.core.signals import Signal
from kvwatch.tools.backtest.models import BacktestResult, TargetTimeline, iso

#: band colours per state (matching the text report's icons)
COLORS: dict[FailureMode, str] = {
    FailureMode.FULL: "#d62728",
    FailureMode.OSCILLATING: "#ff7f0e",
    FailureMode.FRAGMENTED: "#e377c2",
    FailureMode.MISREAD: "#bcbd22",
    FailureMode.IDLE: "#1f77b4",
    FailureMode.HEALTHY: "#2ca02c",
    FailureMode.UNKNOWN: "#7f7f7f",
}
_PANELS = ((Signal.KV_USAGE, "KV usage (ratio)"), (Signal.WAITING, "waiting (requests)"),
           (Signal.PREEMPTIONS, "preemptions (1/s)"))


def _interest(tl: TargetTimeline) -> tuple[int, int, str]:
    bad = sum(s is not FailureMode.HEALTHY for s in tl.states)
    return (-len(tl.incidents), -bad, str(tl.target.key))


def chart_png(result: BacktestResult, tl: TargetTimeline) -> bytes:
    """One PNG: the three panels over the replayed span, state bands behind the lines."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    data = result.history
    fig = Figure(figsize=(10, 5.2), dpi=80)
    axes = fig.subplots(len(_PANELS), 1, sharex=True)
    changes = tl.changes()
    for ax, (sig, title) in zip(axes, _PANELS, strict=True):
        for i, (t, state) in enumerate(changes):
            until = changes[i + 1][0] if i + 1 < len(changes) else result.end
            ax.axvspan((t - result.start) / 60, (max(until, t + result.step_s) - result.start) / 60,
                       color=COLORS[state], alpha=0.18, lw=0)
        vals = None if data is None else data.values(tl.target.key, sig)
        if data is not None and vals is not None:
            keep = data.grid >= result.start - 1e-6
            ax.plot((data.grid[keep] - result.start) / 60, vals[keep], color="black", lw=1)
        else:
            ax.text(0.5, 0.5, "not exported", transform=ax.transAxes, ha="center", color="#555")
        ax.set_ylabel(title, fontsize=8)
        ax.tick_params(labelsize=7)
    for inc in tl.incidents:
        for ax in axes:
            ax.axvline((inc.opened_at - result.start) / 60, color=COLORS[inc.mode], ls="--", lw=1)
    axes[-1].set_xlabel(f"minutes since {iso(result.start)}", fontsize=8)
    fig.suptitle(str(tl.target.key), fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def _table(tl: TargetTimeline) -> str:
    if not tl.incidents:
        return "<p>No incidents would have fired.</p>"
    rows = "".join(
        f"<tr><td>{html.escape(i.mode.value)}</td><td>{i.severity.value}</td><td>{iso(i.opened_at)}</td>"
        f"<td>{iso(i.resolved_at) or 'still open'}</td><td>{html.escape(i.rule)}</td></tr>"
        for i in tl.incidents
    )
    return ("<table><tr><th>mode</th><th>severity</th><th>opened</th><th>resolved</th><th>rule</th></tr>"
            f"{rows}</table>")


def render_html(result: BacktestResult, max_targets: int = 40) -> str:
    ordered = sorted(result.timelines, key=_interest)
    legend = " ".join(f'<span style="background:{c};opacity:.5;padding:0 6px">{m.value}</span>'
                      for m, c in COLORS.items())
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>kvwatch backtest</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;font-size:90%}img{max-width:100%}</style></head><body>",
        f"<h1>kvwatch backtest</h1><p>{iso(result.start)} → {iso(result.end)}, step {result.step_s:g}s, "
        f"{len(result.steps)} evaluations, {len(result.timelines)} targets, {result.queries} queries.</p>",
        f"<p>States: {legend}; dashed lines: incidents fired.</p>",
    ]
    for tl in ordered[:max_targets]:
        png = base64.b64encode(chart_png(result, tl)).decode("ascii")
        parts.append(f"<h2>{html.escape(str(tl.target.key))} <small>{html.escape(tl.target.dialect)}</small></h2>")
        parts.append(f'<img alt="{html.escape(str(tl.target.key))}" src="data:image/png;base64,{png}">')
        parts.append(_table(tl))
    rest = ordered[max_targets:]
    if rest:
        states = [f"{html.escape(str(t.target.key))} ({t.last_state})" for t in rest]
        parts.append(f"<h2>Not charted ({len(rest)})</h2><p>{', '.join(states)}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(path: Path, result: BacktestResult, max_targets: int = 40) -> Path:
    path.write_text(render_html(result, max_targets), encoding="utf-8")
    return path

