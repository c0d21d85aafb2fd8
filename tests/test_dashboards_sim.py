"""Every query of the fleet and instance dashboards against a simulated fleet of every dialect.

One Prometheus per module holds a backfilled simulator fleet (presets ``full`` and
``healthy-busy`` x all ten simulator dialects), the recording rules backfilled over it
with ``promtool tsdb create-blocks-from rules`` (the template variables read
``instance:kvwatch_target:info``), and kvwatch's own verdict gauges from a real
evaluation of that fleet. Each panel query runs at a past instant inside the data with
Grafana's variables substituted.

Dashboards and rules are rendered from the code, as ``python -m kvwatch.tools.dashboards``
writes them (``test_dashboards`` checks the checked-in files equal that rendering).

Expectations are derived, never hand-listed per panel: a panel query must return a series
for exactly the instances whose kvwatch dialect (as discovered) has a source for every
signal / dashboard-only family the query reads *and* whose stored series contain that
source's metric names with its label matchers. So "TTFT on Triton" is expected empty
because the simulated Triton backend does not export the optional first-response
histogram the dialect table lists, not because a title is on a list.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
from support.prom import PROMTOOL, backfill, prometheus, require_binary

from kvwatch.config import load_settings
from kvwatch.core.dialects import DIALECT_BY_ID, Dialect, Source, SourceKind, selector
from kvwatch.core.extras import EXTRA_SOURCES, Extra, extra_sources
from kvwatch.core.models import Evaluation
from kvwatch.core.pipeline import evaluate
from kvwatch.core.promclient import PromClient
from kvwatch.core.rules import load_ruleset
from kvwatch.core.signals import Signal
from kvwatch.service.selfmetrics import SelfMetrics
from kvwatch.sim.corpus import build_corpus, default_end_time
from kvwatch.sim.vocab import Dialect as SimDialect
from kvwatch.tools.dashboards.build import RECORDING_RULES, render_all
from kvwatch.tools.dashboards.common import QUANTILES
from kvwatch.tools.dashboards.queries import (
    PANEL_MATCHERS,
    POOL_KV,
    POOL_QUEUE,
    bucket_increase_exprs,
    external_hit_ratio_expr,
    extra_expr,
    lmcache_hit_ratio_expr,
    numeric_sources,
    prefix_hit_ratio_expr,
    prefix_saved_tokens_expr,
    proxied,
    signal_expr,
)
from kvwatch.tools.dashboards.recording import INFO_RECORD, PREFIX_HIT_RECORD, RECORDS

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = ("kvwatch-fleet", "kvwatch-instance")
PRESETS = ("full", "healthy-busy")  # full: preemptions/retractions move; healthy-busy: steady traffic
DURATION_S, WARMUP_S, STEP_S = 900.0, 120.0, 15
RULE_EVAL_S = 60
RATE = "2m"
#: Grafana's built-ins and the fleet-wide "All" values; ``$instance`` is set per case.
VARS = {"$__rate_interval": RATE, "$__interval": "1m", "$job": ".*", "$namespace": ".*", "$model": ".*",
        "$engine": ".*"}
SELF_JOB, SELF_INSTANCE = "kvwatch", "kvwatch:9877"

#: What a query needs from a target's dialect: dialect → sources, any one of which suffices.
Need = Callable[[Dialect], tuple[Source, ...]]


def _signal_need(sig: Signal) -> Need:
    return lambda d: numeric_sources(d, sig)


def _extra_need(extra: Extra) -> Need:
    return lambda d: extra_sources(d, extra)


def _cache_info_need(d: Dialect) -> tuple[Source, ...]:
    return tuple(s for s in d.sources.get(Signal.KV_CAPACITY_TOKENS, ()) if s.kind is SourceKind.VLLM_CACHE_INFO)


def _bucket_need(src: Source) -> Need:
    return lambda d: (src,) if src in {s for e in Extra for s in extra_sources(d, e)} else ()


def _catalogue() -> list[tuple[str, str, tuple[Need, ...]]]:
    """(label, expression text, needs) for every engine-neutral expression the dashboards embed."""
    out: list[tuple[str, str, tuple[Need, ...]]] = []
    for sig in Signal:
        out.append((str(sig), signal_expr(sig), (_signal_need(sig),)))
        out += [(f"{sig}@{q}", signal_expr(sig, quantile=q), (_signal_need(sig),)) for q in QUANTILES]
    for extra in Extra:
        out.append((str(extra), extra_expr(extra), (_extra_need(extra),)))
        srcs = {s for d in DIALECT_BY_ID.values() for s in extra_sources(d, extra)}
        for q in bucket_increase_exprs(extra):
            src = next(s for s in srcs if f"{s.metric}_bucket{{" in q)
            out.append((f"{extra} buckets {src.metric}", q, (_bucket_need(src),)))
    out.append(
        ("prefix hit ratio", prefix_hit_ratio_expr(),
         (_extra_need(Extra.PREFIX_HIT_TOKENS), _extra_need(Extra.PREFIX_QUERY_TOKENS)))
    )
    for proxy in (True, False):  # KV usage: measured and proxy dialects are separate series
        ids = {d.id for d in proxied(Signal.KV_USAGE, proxy)}
        out.append((f"kv_usage proxy={proxy}", signal_expr(Signal.KV_USAGE, dialects=proxied(Signal.KV_USAGE, proxy)),
                    (lambda d, ids=ids: numeric_sources(d, Signal.KV_USAGE) if d.id in ids else (),)))
    out.append(("external hit ratio", external_hit_ratio_expr(),
                (_extra_need(Extra.EXTERNAL_HIT_TOKENS), _extra_need(Extra.EXTERNAL_QUERY_TOKENS))))
    out.append(("lmcache hit ratio", lmcache_hit_ratio_expr(),
                (_extra_need(Extra.LMCACHE_HIT_TOKENS), _extra_need(Extra.LMCACHE_REQUESTED_TOKENS))))
    # the inference gateway's pool gauges come from the EPP, not from an engine: no simulated target has them
    out += [(f"gateway {m}", m, (lambda d: (),)) for m in (POOL_KV, POOL_QUEUE)]
    cache_info = {s.promql(PANEL_MATCHERS, "") for d in DIALECT_BY_ID.values()
                  for s in _cache_info_need(d)}
    out += [("vllm cache info", q, (_cache_info_need,)) for q in sorted(cache_info)]
    return out


CATALOGUE = _catalogue()


def _needs_of(expr: str) -> tuple[list[str], tuple[Need, ...]]:
    """Catalogue entries contained in ``expr`` (an entry inside a longer matching one is dropped)."""
    hits = [(label, text, needs) for label, text, needs in CATALOGUE if text in expr]
    keep = [h for h in hits if not any(h[1] != o[1] and h[1] in o[1] for o in hits)]
    return [h[0] for h in keep], tuple(n for h in keep for n in h[2])


def _instant(url: str, expr: str, at: float) -> list[dict[str, Any]]:
    r = requests.get(f"{url}/api/v1/query", params={"query": expr, "time": at}, timeout=10)
    assert r.status_code == 200, f"{expr}\n→ HTTP {r.status_code}: {r.text[:400]}"
    body = r.json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


@dataclass(frozen=True)
class SimProm:
    """The running Prometheus and what the test knows about its data."""

    url: str
    at: float
    evaluation: Evaluation
    sim_dialect: dict[str, str]  # instance → simulator dialect id
    kv_dialect: dict[str, str]  # instance → kvwatch dialect id (discovery)
    model: dict[str, str]  # instance → model label of the info record
    _present: dict[str, frozenset[str]] = field(default_factory=dict)  # selector → instances (cache)

    def query(self, expr: str) -> list[dict[str, Any]]:
        return _instant(self.url, expr, self.at)

    def with_series(self, metric: str, matchers: str = "") -> frozenset[str]:
        """Instances holding a series of ``metric{matchers}`` at the instant."""
        sel = selector(metric, matchers, 'job!="kvwatch"')
        if sel not in self._present:
            self._present[sel] = frozenset(r["metric"]["instance"] for r in self.query(f"group by (instance) ({sel})"))
        return self._present[sel]

    def exports(self, inst: str, src: Source) -> bool:
        names = src.requires
        # a lazily created counter's source needs only its anchor (the counter reads 0 until it exists)
        first = self.with_series(names[0], "" if src.lazy_anchor else src.matchers)
        return inst in first and all(inst in self.with_series(n) for n in names[1:])

    def expected(self, needs: tuple[Need, ...]) -> set[str]:
        """Instances that export, for every need, one of their dialect's sources."""
        return {
            inst for inst, did in self.kv_dialect.items()
            if all(any(self.exports(inst, s) for s in need(DIALECT_BY_ID[did])) for need in needs)
        }


def _promtool_rules(url: str, start: float, end: float, out: Path) -> None:
    rules = out.parent / "kvwatch-recording.yaml"
    rules.write_text(render_all()[RECORDING_RULES], encoding="utf-8")
    res = subprocess.run(
        [require_binary(PROMTOOL), "tsdb", "create-blocks-from", "rules", f"--url={url}", f"--start={int(start)}",
         f"--end={int(end)}", f"--eval-interval={RULE_EVAL_S}s", f"--output-dir={out}", "--quiet",
         str(rules)],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, f"promtool rules backfill failed: {res.stderr[-2000:]}"


def _label_text(labels: dict[str, str]) -> str:
    esc = {k: v.replace("\\", r"\\").replace('"', r"\"") for k, v in sorted(labels.items())}
    return "{" + ",".join(f'{k}="{v}"' for k, v in esc.items()) + "}"


def _self_metrics_openmetrics(ev: Evaluation, end: int) -> str:
    """kvwatch's gauges after ``ev`` as scraped with ``honor_labels`` over the last 10 minutes."""
    sm = SelfMetrics()
    sm.observe_evaluation(ev)
    lines: list[str] = []
    for fam in sm.registry.collect():
        if fam.type != "gauge" or not fam.samples:
            continue
        lines.append(f"# TYPE {fam.name} gauge")
        for s in fam.samples:
            labels = {"job": SELF_JOB, "instance": SELF_INSTANCE, **s.labels}  # honor_labels keeps the target's
            lines += [f"{s.name}{_label_text(labels)} {s.value} {ts}" for ts in range(end - 600, end + 1, STEP_S)]
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def sim_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProm]:
    require_binary(PROMTOOL)
    tmp = tmp_path_factory.mktemp("dash-sim")
    end = default_end_time(lag_s=2 * 3600)  # well before the head block of a fresh Prometheus
    doc = build_corpus(tmp / "corpus", presets=PRESETS, dialects=list(SimDialect), seeds=[1],
                       duration_s=DURATION_S, warmup_s=WARMUP_S, scrape_interval_s=STEP_S,
                       end_time=end, full_cross=True)
    tsdb = tmp / "tsdb"
    backfill(tmp / "corpus" / "fleet.om", tsdb)
    at = datetime.fromtimestamp(end, UTC)
    with prometheus(tsdb=tsdb) as url:
        ev = evaluate(PromClient(url), load_settings(None, environ={}), load_ruleset(), at)
        _promtool_rules(url, end - DURATION_S + 2 * 60, end, tmp / "rule-blocks")
    for block in (tmp / "rule-blocks").iterdir():
        if (block / "meta.json").exists():
            shutil.move(str(block), tsdb / block.name)
    (tmp / "self").mkdir()
    backfill(_self_metrics_openmetrics(ev, int(end)), tmp / "self" / "tsdb")
    for block in (tmp / "self" / "tsdb").iterdir():
        shutil.move(str(block), tsdb / block.name)
    sim_dialect = {t["instance"]: t["dialect"] for t in doc["targets"]}
    kv_dialect = {r.target.key.instance: r.target.dialect for r in ev.results}
    with prometheus(tsdb=tsdb) as url:
        model = {r["metric"]["instance"]: r["metric"].get("model", "") for r in _instant(url, INFO_RECORD, end)}
        yield SimProm(url, float(end), ev, sim_dialect, kv_dialect, model)


def _substitute(expr: str, instance: str) -> str:
    for var, val in {**VARS, "$instance": instance}.items():
        expr = expr.replace(var, val)
    left = re.findall(r"\$(?!\d)\w+", expr)
    assert not left, f"unsubstituted template variables {left} in {expr}"
    return expr


def _dashboard(uid: str) -> dict[str, Any]:
    """The dashboard as the generator renders it now (test_dashboards checks the files equal it)."""
    return json.loads(render_all()[f"dashboards/{uid}.json"])


def _panel_queries(dash: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(panel title, expr, panel) of every target; nested row panels included."""
    out = []
    for p in dash["panels"]:
        for q in (p, *p.get("panels", [])):
            out += [(q["title"], t["expr"], q) for t in q.get("targets", [])]
    return out


def _describe(sp: SimProm, insts: set[str]) -> list[str]:
    return sorted(f"{sp.sim_dialect.get(i, '?')} ({i})" for i in insts)


def _self_expected(sp: SimProm, expr: str) -> set[str] | None:
    """Instances a kvwatch self-metric query must return; None when ``expr`` reads no self-metric."""
    res = sp.evaluation.results
    if "kvwatch_diagnosis_active" in expr:
        return {r.target.key.instance for r in res if r.diagnoses}
    if "kvwatch_target_state" in expr or "kvwatch_target_missing_signals" in expr:
        return {r.target.key.instance for r in res}
    if "kvwatch_targets" in expr:
        return set()  # kvwatch-wide, no per-target labels
    return None


def _check_values(title: str, panel: dict[str, Any], result: list[dict[str, Any]]) -> list[str]:
    """Finite values of ratio panels lie in [0, 1]; of seconds/token panels are >= 0."""
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    lo, hi = defaults.get("min"), defaults.get("max")
    bad = []
    for r in result:
        v = float(r["value"][1])
        if math.isfinite(v) and ((lo is not None and v < lo - 1e-9) or (hi is not None and v > hi + 1e-9)):
            bad.append(f"{title}: {r['metric']} = {v} outside [{lo}, {hi}]")
    return bad


def _shape(expr: str) -> str:
    """How the outermost aggregation groups: ``per-target``, ``per-model`` or ``aggregate``."""
    m = re.search(r"\bby \(([^)]*)\)", expr)
    labels = {x.strip() for x in m.group(1).split(",")} if m else {"instance"}
    return "per-target" if "instance" in labels else "per-model" if "model" in labels else "aggregate"


def _check_query(sp: SimProm, title: str, expr: str, panel: dict[str, Any], instance: str) -> list[str]:
    """Problems of one panel query with ``$instance`` = ``instance`` (a regex)."""
    result = sp.query(_substitute(expr, instance))
    scope = {i for i in sp.kv_dialect if re.fullmatch(instance, i)}
    problems = _check_values(title, panel, result)
    self_exp = _self_expected(sp, expr)
    if self_exp is not None:
        want = self_exp & scope
    else:
        _, needs = _needs_of(expr)
        if not needs:
            return [f"{title}: query reads nothing the dialect table or extras declare: {expr}"]
        want = sp.expected(needs) & scope
    shape = _shape(expr)
    if shape == "per-target":
        got = {r["metric"].get("instance", "") for r in result}
        if want - got:
            problems.append(f"{title}: no data for {_describe(sp, want - got)}\n    expr: {expr}")
        if got - want:
            problems.append(f"{title}: data for {_describe(sp, got - want)}, which export no source of it"
                            f"\n    expr: {expr}")
    elif shape == "per-model":
        want_models = {sp.model[i] for i in want}
        got_models = {r["metric"].get("model", "") for r in result}
        if got_models != want_models:
            problems.append(f"{title}: models {sorted(got_models)}, expected {sorted(want_models)}\n    expr: {expr}")
    elif bool(result) != (bool(want) or (self_exp is not None and not self_exp)):
        problems.append(f"{title}: {len(result)} series, expected data from {_describe(sp, want)}\n    expr: {expr}")
    return problems


def test_every_simulated_dialect_is_discovered(sim_prom: SimProm) -> None:
    assert set(sim_prom.sim_dialect.values()) == {d.value for d in SimDialect}
    assert set(sim_prom.kv_dialect) == set(sim_prom.sim_dialect), "discovery missed simulated targets"
    assert "stale" not in sim_prom.kv_dialect.values()


def test_template_variables_list_every_target(sim_prom: SimProm) -> None:
    """Chained variables resolve like Grafana's label_values() over the backfilled info record."""
    for uid in DASHBOARDS:
        values: dict[str, str] = {}
        for var in _dashboard(uid)["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["definition"])
            assert m, var["definition"]
            match, label = m.groups()
            for name, val in values.items():
                match = match.replace(f"${name}", val)
            r = requests.get(f"{sim_prom.url}/api/v1/series", timeout=10,
                             params={"match[]": match, "start": sim_prom.at - 300, "end": sim_prom.at})
            assert r.status_code == 200, r.text
            found = {s[label] for s in r.json()["data"] if s.get(label)}
            if label == "instance":
                assert found == set(sim_prom.sim_dialect), f"{uid}: instance variable lists {sorted(found)}"
            elif label in ("job", "model", "engine"):
                assert found, f"{uid}: variable {var['name']} has no values ({var['definition']})"
            # "All" (custom all-value .* where defined); an empty list (namespace here) also resolves to All
            values[var["name"]] = var.get("allValue") or "|".join(sorted(found))
        assert values.get("engine") == ".*"


@pytest.mark.parametrize("uid", DASHBOARDS)
def test_every_panel_query_returns_data_per_dialect(sim_prom: SimProm, uid: str) -> None:
    dash = _dashboard(uid)
    queries = _panel_queries(dash)
    assert len(queries) > 15
    if uid == "kvwatch-fleet":
        cases = [".*"]
    else:  # single-valued $instance: one concrete target per simulator dialect
        first: dict[str, str] = {}
        for inst, d in sorted(sim_prom.sim_dialect.items()):
            first.setdefault(d, inst)
        cases = sorted(first.values())
    problems: list[str] = []
    for instance in cases:
        for title, expr, panel in queries:
            problems += _check_query(sim_prom, title, expr, panel, instance)
        for ann in dash.get("annotations", {}).get("list", []):
            problems += _check_query(sim_prom, f"annotation {ann['name']}", ann["expr"], {}, instance)
    assert not problems, f"{uid}: {len(problems)} problem(s):\n" + "\n".join(dict.fromkeys(problems))


def test_recording_rules_cover_every_dialect_that_exports_the_signal(sim_prom: SimProm) -> None:
    """Backfilled records carry one series per target that exports the signal, with its engine."""
    problems = []
    records = [(rec, (_signal_need(sig),)) for sig, rec in RECORDS.items()]
    records.append(
        (f"{PREFIX_HIT_RECORD}", (_extra_need(Extra.PREFIX_HIT_TOKENS), _extra_need(Extra.PREFIX_QUERY_TOKENS)))
    )
    for rec, needs in records:
        result = sim_prom.query(rec)
        got = {r["metric"]["instance"] for r in result}
        want = sim_prom.expected(needs)
        if got != want:
            problems.append(f"{rec}: missing {_describe(sim_prom, want - got)}, unexpected "
                            f"{_describe(sim_prom, got - want)}")
        for r in result:
            inst = r["metric"]["instance"]
            if r["metric"].get("engine") != DIALECT_BY_ID[sim_prom.kv_dialect[inst]].engine:
                problems.append(f"{rec}: {inst} has engine {r['metric'].get('engine')}")
    info = {r["metric"]["instance"] for r in sim_prom.query(INFO_RECORD)}
    if info != set(sim_prom.sim_dialect):
        problems.append(f"{INFO_RECORD}: missing {_describe(sim_prom, set(sim_prom.sim_dialect) - info)}")
    assert not problems, "\n".join(problems)


#: Dashboard-only families real engines export (shared/engine-metrics.md) that the simulated
#: versions do not: their panels are expected empty for those dialects here.
SIM_GAPS: dict[tuple[str, Extra], str] = {
    ("vllm-v0", Extra.PREFIX_HIT_TOKENS): "V0 0.6 has only the gpu_prefix_cache_hit_rate gauge; counters from 0.7.3",
    ("vllm-v0", Extra.PREFIX_QUERY_TOKENS): "same",
    ("sglang", Extra.PROMPT_LENGTH): "prompt_tokens_histogram: >= 0.4.6 with --collect-tokens-histogram",
    ("sglang", Extra.OUTPUT_LENGTH): "same",
    ("sglang-ray", Extra.PROMPT_LENGTH): "same",
    ("sglang-ray", Extra.OUTPUT_LENGTH): "same",
    ("trtllm-serve", Extra.PREFIX_HIT_TOKENS): "trtllm_prompt_cached_tokens_total (engine-metrics.md section 2)",
    # KV-connector / offload families: only with a connector (LMCache, NIXL, the CPU offloading one)
    **{(d, e): "only with a KV connector configured; the simulator runs none"
       for d in ("vllm-v0", "vllm-v1")
       for e in (Extra.EXTERNAL_HIT_TOKENS, Extra.EXTERNAL_QUERY_TOKENS, Extra.CACHED_PROMPT_TOKENS,
                 Extra.OFFLOAD_USAGE, Extra.LMCACHE_HIT_TOKENS, Extra.LMCACHE_REQUESTED_TOKENS,
                 Extra.LMCACHE_LOCAL_BYTES)},
}


def test_dashboard_only_families_match_the_simulators_names(sim_prom: SimProm) -> None:
    """Every extra family (prefix cache, lengths, block counts) is exported under the declared
    names by some simulated target of each kvwatch dialect that declares it, except the
    families the simulator does not model (SIM_GAPS)."""
    by_dialect: dict[str, set[str]] = {}
    for inst, did in sim_prom.kv_dialect.items():
        by_dialect.setdefault(did, set()).add(inst)
    unmatched = []
    for did, fams in EXTRA_SOURCES.items():
        insts = by_dialect.get(did, set())
        assert insts, f"no simulated target speaks kvwatch dialect {did}"
        for extra, srcs in fams.items():
            exported = any(sim_prom.exports(i, s) for i in insts for s in srcs)
            if not exported and (did, extra) not in SIM_GAPS:
                unmatched.append(f"{did} {extra}: {[s.metric for s in srcs]} (simulated: "
                                 f"{sorted({sim_prom.sim_dialect[i] for i in insts})})")
    assert not unmatched, "extras no simulated target exports:\n" + "\n".join(unmatched)


def test_prefill_tokens_saved_reads_in_tokens_for_every_version(sim_prom: SimProm) -> None:
    """Saved tokens/s over prompt tokens/s equals the hit-rate panel, also where the engine
    counts prefix hits in blocks (simulated vLLM 0.8.2): a raw block counter is 16x too low."""
    exprs = {e for _, e, _ in _panel_queries(_dashboard("kvwatch-fleet"))}
    saved_q, ratio_q = prefix_saved_tokens_expr(), prefix_hit_ratio_expr()
    prompt_q = signal_expr(Signal.PROMPT_TPS)
    assert {saved_q, ratio_q} <= exprs and any(prompt_q in e for e in exprs)

    def per_instance(expr: str) -> dict[str, float]:
        return {r["metric"]["instance"]: float(r["value"][1]) for r in sim_prom.query(_substitute(expr, ".*"))}

    saved, ratio, prompt = per_instance(saved_q), per_instance(ratio_q), per_instance(prompt_q)
    assert "vllm-0.8.2" in {sim_prom.sim_dialect[i] for i in saved}
    for inst, v in saved.items():
        assert 0 <= v <= prompt[inst], (inst, v, prompt[inst])
        assert v == pytest.approx(ratio[inst] * prompt[inst], rel=0.1), sim_prom.sim_dialect[inst]
