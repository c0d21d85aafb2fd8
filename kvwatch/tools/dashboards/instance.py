"""The instance drilldown dashboard (uid ``kvwatch-instance``).

kvwatch's Slack messages link here with ``?var-instance=<instance>&from=…&to=…``.
One target's signals side by side, kvwatch's diagnoses as annotations, and the
triage order rendered from the bundled classification rules.
"""

from __future__ import annotations

import re
from typing import Any

from kvwatch.core.models import FailureMode
from kvwatch.core.rules import RuleSet, load_ruleset
from kvwatch.core.signals import Signal
from kvwatch.tools.dashboards import common as c
from kvwatch.tools.dashboards.grafana import DATASOURCE, Dashboard, Panel, PanelType, Target, row
from kvwatch.tools.dashboards.queries import signal_expr

_SEL = '{instance=~"$instance"}'
#: Prometheus annotation query: one region per contiguous stretch a diagnosis was active.
DIAGNOSIS_ANNOTATION: dict[str, Any] = {
    "datasource": DATASOURCE,
    "enable": True,
    "expr": f"max by (job, instance, mode, severity) (kvwatch_diagnosis_active{_SEL}) == 1",
    "hide": False,
    "iconColor": "red",
    "name": "kvwatch diagnoses",
    "step": "60s",
    "tagKeys": "mode,severity",
    "textFormat": "kvwatch diagnosed {{mode}} ({{severity}}) on {{instance}}",
    "titleFormat": "{{mode}}",
    "useValueForTime": False,
}
_PLACEHOLDER = re.compile(r"\{[^{}]*\}")


def triage_markdown(rules: RuleSet) -> str:
    """The general triage order plus each mode's ordered checklist (numbers shown as ``…``)."""
    lines = [
        "**Triage order** (failure-modes.md): first bucket user-facing latency (prompt length, output "
        "length, tenant), then KV usage and preemptions, then batch composition and bandwidth - only then "
        "change capacity, admission or cache policy.",
        "",
        "Precedence when several modes match: " + " > ".join(m.value for m in FailureMode if m is not FailureMode.UNKNOWN) + ".",
    ]
    for mode in FailureMode:
        for rule in rules.by_mode(mode):
            lines += ["", f"**{mode.value}** - `{rule.id}`: {rule.description}"]
            lines += [f"{i}. {_PLACEHOLDER.sub('…', step)}" for i, step in enumerate(rule.triage, start=1)]
    return "\n".join(lines)


def verdict_panels(rules: RuleSet) -> tuple[Panel, ...]:
    return (
        Panel(
            "kvwatch state",
            PanelType.STAT,
            "The state kvwatch assigned at its last cycle. The annotations on every graph mark when each "
            "diagnosis was active; hover them for mode and severity.",
            (Target(f"max by (state) (kvwatch_target_state{_SEL}) == 1", "{{state}}", instant=True),),
            width=6,
        ),
        Panel(
            "Active diagnoses",
            PanelType.TABLE,
            "Every diagnosis active now (all matches, not only the primary state), with severity.",
            (
                Target(
                    f"max by (instance, mode, severity) (kvwatch_diagnosis_active{_SEL}) == 1",
                    instant=True,
                    fmt="table",
                ),
            ),
            width=9,
        ),
        Panel(
            "Missing signals (blind spots)",
            PanelType.STAT,
            "How many canonical signals this target does not export. Rules that need them are skipped, so "
            "a mode cannot be ruled out - it is not 'healthy'. 0 is the goal.",
            (Target(f"max by (instance) (kvwatch_target_missing_signals{_SEL})", "missing", instant=True),),
            width=9,
            thresholds=((1, "orange"),),
        ),
        Panel("Triage order", PanelType.TEXT, "How to work a kvwatch diagnosis.", content=triage_markdown(rules),
              width=24, height=14),
    )


def build(rules: RuleSet | None = None) -> Dashboard:
    rules = rules if rules is not None else load_ruleset()
    kv, cap = signal_expr(Signal.KV_USAGE), signal_expr(Signal.KV_CAPACITY_TOKENS)
    panels = (
        row("kvwatch verdict"),
        *verdict_panels(rules),
        row("KV cache and scheduler"),
        c.kv_usage_panel(),
        c.scheduler_panel(),
        c.preemption_panel(),
        Panel(
            "KV headroom (tokens)",
            PanelType.TIMESERIES,
            "Free KV tokens = (1 - usage) x the pool size the engine reports. Divide by the typical "
            "prompt+output length to get requests of headroom. Empty for vLLM (capacity is label-only).",
            (Target(f"(1 - ({kv})) * on (job, instance) ({cap})", "{{instance}} free tokens"),),
            min=0,
        ),
        row("Latency and throughput"),
        c.ttft_panel(),
        c.queue_panel(),
        c.itl_panel(),
        c.tokens_panel(),
        c.requests_panel(),
        *c.prefix_panels(),
    )
    return Dashboard(
        uid=c.INSTANCE_UID,
        title="kvwatch / Instance drilldown",
        description="One engine instance's KV, scheduler and latency signals side by side, with kvwatch's "
        "diagnoses as annotations and the triage checklist. Linked from kvwatch's Slack messages.",
        panels=panels,
        variables=c.target_variables(single_instance=True),
        annotations=(DIAGNOSIS_ANNOTATION,),
        links=c.dashboard_links(c.INSTANCE_UID),
        time_from="now-1h",
    )
