"""Discovery: which engine instances exist and which dialect each one speaks.

One instant query asks Prometheus which of the metric names any dialect uses
exist, grouped by target: the set of names tells the dialect and which signals
each target can provide. A second query finds targets that reported KV usage
during the window but not now (stale), so they are reported, not forgotten.
When there are stale targets, a third asks for ``up``: a stale target whose
``up`` series is absent while its job still has ``up`` series left scraping
(deleted pod, rollout, dropped from discovery) and is marked ``gone``; one with
``up`` present (scrape failing) or whose job has no ``up`` at all (a store
without scrape metadata) stays blind.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from kvwatch.core.dialects import DIALECTS, Dialect, all_names, selector
from kvwatch.core.models import Target, TargetKey
from kvwatch.core.promclient import QueryClient, Series
from kvwatch.core.signals import Signal
from kvwatch.durations import format_duration

#: labels read by discovery besides the target labels
_INFO_LABELS = ("model_name", "model", "server", "engine_type")


def discovery_query(user_matchers: str, names: Iterable[str] | None = None) -> str:
    names = sorted(names if names is not None else all_names())
    regex = "|".join(re.escape(n) for n in names)
    sel = selector("", f'__name__=~"{regex}"', user_matchers)
    return f"group by (__name__, job, instance, {', '.join(_INFO_LABELS)}) ({sel})"


def fingerprint_query(user_matchers: str) -> str:
    """One number that changes when a target appears or goes stale: the live dialect-marker series.

    Every target exports at least one marker name of its dialect, so the count moves
    when an engine starts or stops being scraped. Far cheaper than discovery (a few
    series per target, no labels returned): the service asks it every cycle and
    runs discovery again only when it changes, or every ``discovery.refresh_cycles``
    cycles for what a count cannot see (metric names or model labels that change).
    """
    names = sorted({m for d in DIALECTS for m in d.markers})
    name_matcher = f'__name__=~"{"|".join(re.escape(n) for n in names)}"'
    return f"count({selector('', name_matcher, user_matchers)})"


def stale_query(user_matchers: str, window_s: float) -> str:
    names = sorted({s.requires[0] for d in DIALECTS for s in d.sources.get(Signal.KV_USAGE, ())})
    w = format_duration(window_s)
    parts = [f"group by (job, instance) (last_over_time({selector(n, user_matchers)}[{w}]))" for n in names]
    return " or ".join(parts)


def _detect(
    names: set[str], labels: dict[str, set[str]], allowed: tuple[str, ...], triton_model: str = ""
) -> Dialect | None:
    for d in DIALECTS:
        if allowed and d.id not in allowed:
            continue
        if d.required_label and not labels.get(d.required_label, set()) - {""}:
            continue
        if d.model_pattern:
            pattern = re.compile(triton_model or d.model_pattern)
            if not any(pattern.fullmatch(m) for m in labels.get("model", set()) - {""}):
                continue
        if any(m in names for m in d.markers):
            return d
    return None


def parse_discovery(rows: list[Series], allowed: tuple[str, ...] = (), triton_model: str = "") -> list[Target]:
    """Turn discovery rows into targets. Router look-alikes (``server`` label, no model) are skipped.

    ``triton_model``: regex of the Triton model holding the LLM (default: ``tensorrt_llm``
    for a Triton server that exports only core metrics, i.e. the LLM-API backend).
    """
    names: dict[TargetKey, set[str]] = defaultdict(set)
    labels: dict[TargetKey, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    models: dict[TargetKey, dict[str, str]] = defaultdict(dict)
    for row in rows:
        m = row.get("metric", {})
        name = m.get("__name__", "")
        if not name or "instance" not in m:
            continue
        if m.get("server") and not m.get("model_name") and name.startswith("vllm:"):
            continue  # production-stack router re-export, not an engine
        key = TargetKey(m.get("job", ""), m["instance"])
        names[key].add(name)
        for lab in _INFO_LABELS:
            labels[key][lab].add(m.get(lab, ""))
        model = m.get("model_name") or m.get("model") or ""
        if model:
            models[key].setdefault(name, model)
    out: list[Target] = []
    for key, ns in names.items():
        d = _detect(ns, labels[key], allowed, triton_model)
        if d is None:
            continue
        kv_names = [s.requires[0] for s in d.sources.get(Signal.KV_USAGE, ())]
        by_name = models[key]
        model = next((by_name[n] for n in kv_names if n in by_name), "") or min(by_name.values(), default="")
        out.append(Target(key, d.id, d.engine, model, frozenset(ns)))
    out.sort(key=lambda t: (t.key.job, t.key.instance))
    return out


def discover(
    client: QueryClient,
    at: datetime,
    window_s: float,
    user_matchers: str,
    allowed: tuple[str, ...] = (),
    triton_model: str = "",
) -> list[Target]:
    """Targets live at ``at`` plus stale ones (KV usage seen in the window, none now)."""
    live = parse_discovery(client.instant(discovery_query(user_matchers), at), allowed, triton_model)
    stale = stale_keys(live, client.instant(stale_query(user_matchers, window_s), at))
    if stale:
        live += stale_targets(stale, client.instant(up_query(user_matchers), at))
    return live


def stale_keys(live: list[Target], rows: list[Series]) -> list[TargetKey]:
    """Targets in the stale query's answer ``rows`` that live discovery did not find, in answer order."""
    seen = {t.key for t in live}
    stale: list[TargetKey] = []
    for row in rows:
        m = row.get("metric", {})
        if "instance" not in m:
            continue
        key = TargetKey(m.get("job", ""), m["instance"])
        if key not in seen:
            seen.add(key)
            stale.append(key)
    return stale


def stale_targets(stale: list[TargetKey], up_rows: list[Series]) -> list[Target]:
    """Stale targets, ``gone`` when their ``up`` is absent while their job still has ``up`` series."""
    scraped = {TargetKey(m.get("job", ""), m["instance"])
               for row in up_rows if "instance" in (m := row.get("metric", {}))}
    jobs = {k.job for k in scraped}
    return [Target(k, "stale", "unknown", gone=k not in scraped and k.job in jobs) for k in stale]


def up_query(user_matchers: str) -> str:
    return f"group by (job, instance) ({selector('up', user_matchers)})"

