"""Serving stacks beyond vLLM/SGLang/TensorRT-LLM, from /metrics fixtures written from their source.

Each file in ``tests/fixtures/engines/metrics`` is what one target of that stack serves
(its first line names the upstream file). They are replayed as a few scrapes into a real
Prometheus; kvwatch must recognise each from its names alone, read its signals as
the stack means them, count a Dynamo worker that re-exports vLLM's metrics once, and
say where KV usage is only a proxy.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.prom import backfill, prometheus

from kvwatch.config import load_settings
from kvwatch.core.collect import collect, resolve
from kvwatch.core.discover import discover
from kvwatch.core.models import Target
from kvwatch.core.pipeline import evaluate
from kvwatch.core.promclient import PromClient
from kvwatch.core.rules import load_ruleset
from kvwatch.core.signals import Signal
from kvwatch.tools.dashboards.queries import proxied, signal_expr
from kvwatch.tools.dashboards.recording import RECORDS, info_rules, signal_rules

pytestmark = pytest.mark.prometheus

FIXTURES = Path(__file__).parent / "fixtures" / "engines" / "metrics"
#: fixture → (engine, dialect) recognised from the names alone
EXPECTED = {
    "lmdeploy": ("lmdeploy", "lmdeploy"),
    "tgi": ("tgi", "tgi"),
    "dynamo-frontend": ("dynamo", "dynamo-frontend"),
    "dynamo-worker": ("dynamo", "dynamo-worker"),
    "dynamo-worker-vllm": ("vllm", "vllm-v1"),  # re-exports vLLM's metrics: a vLLM target
    "ray-serve-vllm": ("vllm", "vllm-ray"),
    "ray-serve-sglang": ("sglang", "sglang-ray"),
    "triton-llmapi": ("trtllm", "trtllm-triton-llmapi"),
    "llm-d-inference-sim": ("vllm", "vllm-v1"),  # real vLLM names, simulated values
}
#: target labels a scrape config adds (Kubernetes relabelling), per fixture
TARGET_LABELS = {"llm-d-inference-sim": {"image": "ghcr.io/llm-d/llm-d-inference-sim:v0.6.1"}}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
SCRAPES = 8


def _openmetrics(t0: float) -> str:
    """Every fixture as one target (job ``stacks``, instance = file stem), SCRAPES scrapes 15 s apart.

    Counters grow by 1 % per scrape so rates exist; gauges and info series hold their value.
    """
    kinds: dict[str, str] = {}
    lines: dict[str, list[str]] = defaultdict(list)
    for path in sorted(FIXTURES.glob("*.prom")):
        types: dict[str, str] = {}
        for line in path.read_text().splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split()
                types[name] = kind
                continue
            m = _SAMPLE.match(line.strip())
            if not m or line.startswith("#"):
                continue
            name, labels, value = m.groups()
            family = next((f for f in types if name == f or name.startswith(f + "_")), name)
            kind = types.get(family, "gauge")
            om_family = family.removesuffix("_total") if kind == "counter" else family
            kinds[om_family] = {"counter": "counter", "histogram": "histogram"}.get(kind, "gauge")
            if kind == "counter" and not name.endswith("_total"):
                kinds[om_family] = "unknown"  # a Rust/C++ counter scraped without _total
            pairs = [f'{k}="{v}"' for k, v in _LABEL.findall(labels or "")]
            own = [f'{k}="{v}"' for k, v in TARGET_LABELS.get(path.stem, {}).items()]
            full = "{" + ",".join([f'job="stacks",instance="{path.stem}"', *own, *pairs]) + "}"
            grows = kind in ("counter", "histogram") and not name.endswith(("_created",))
            for i in range(SCRAPES):
                v = float(value) * (1 + 0.01 * i) if grows else float(value)
                lines[om_family].append(f"{name}{full} {v:.6g} {t0 + 15 * i:.0f}")
    out = []
    for fam in sorted(lines):
        out.append(f"# TYPE {fam} {kinds[fam]}")
        out.extend(lines[fam])
    return "\n".join(out) + "\n# EOF\n"


@dataclass(frozen=True)
class Env:
    url: str
    at: datetime
    targets: dict[str, Target]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    t0 = float(int(time.time() // 60) * 60 - 7200)
    work = tmp_path_factory.mktemp("stacks")
    backfill(_openmetrics(t0), work / "tsdb")
    at = datetime.fromtimestamp(t0 + 15 * (SCRAPES - 1), tz=UTC)
    with prometheus(work / "tsdb") as url:
        targets = {t.key.instance: t for t in discover(PromClient(url), at, 1800.0, "")}
        yield Env(url, at, targets)


def _now(env: Env, name: str, sig: Signal) -> float | None:
    t = env.targets[name]
    data = collect(PromClient(env.url), [t], at=env.at, window_s=60.0, step_s=15.0, rate_window="1m",
                   user_matchers="")
    vals = data.values(t.key, sig)
    return None if vals is None else float(vals[-1])


def test_every_stack_is_recognised_from_names_alone(env: Env) -> None:
    got = {name: (t.engine, t.dialect) for name, t in env.targets.items()}
    assert got == EXPECTED


@pytest.mark.parametrize(
    ("name", "kv"),
    [("lmdeploy", 0.93), ("tgi", 120000 / 131072), ("dynamo-worker", 0.81), ("dynamo-frontend", 3500 / 4096),
     ("dynamo-worker-vllm", 0.55), ("ray-serve-vllm", 0.9), ("ray-serve-sglang", 0.81)],
)
def test_kv_usage_as_each_stack_means_it(env: Env, name: str, kv: float) -> None:
    assert _now(env, name, Signal.KV_USAGE) == pytest.approx(kv, rel=1e-6)


def test_scheduler_signals(env: Env) -> None:
    assert _now(env, "lmdeploy", Signal.RUNNING) == 48 and _now(env, "lmdeploy", Signal.WAITING) == 7
    assert _now(env, "tgi", Signal.RUNNING) == 32 and _now(env, "tgi", Signal.WAITING) == 14
    assert _now(env, "tgi", Signal.KV_CAPACITY_TOKENS) == 131072
    # Ray node with two replicas: like data-parallel engines, counts add up, KV is the fullest
    assert _now(env, "ray-serve-vllm", Signal.RUNNING) == 32
    assert _now(env, "ray-serve-sglang", Signal.KV_CAPACITY_TOKENS) == 500000


def test_dynamo_frontend_fills_running_versus_cap(env: Env) -> None:
    assert _now(env, "dynamo-frontend", Signal.RUNNING) == 40 - 6  # in flight past their first token
    assert _now(env, "dynamo-frontend", Signal.WAITING) == 6
    assert _now(env, "dynamo-frontend", Signal.MAX_RUNNING) == 256 * 2  # max_num_seqs x workers
    assert _now(env, "dynamo-frontend", Signal.KV_CAPACITY_TOKENS) == 4096 * 16 * 2
    assert _now(env, "dynamo-worker", Signal.RUNNING) == 21  # the generate endpoint only


def test_lmdeploy_aborts_are_the_failed_response_types(env: Env) -> None:
    # cancelled 12 of 1512 finished; 1 % growth per 15 s scrape
    assert _now(env, "lmdeploy", Signal.ABORT_RATE) == pytest.approx(12 * 0.01 / 15, rel=1e-3)
    assert Signal.PREEMPTIONS not in resolve(env.targets["lmdeploy"])  # LMDeploy exports none


def test_recording_rules_count_each_target_once(env: Env) -> None:
    client = PromClient(env.url)
    engines: dict[tuple[str, str], set[str]] = defaultdict(set)
    for rule in [*info_rules(), *signal_rules()]:
        for row in client.instant(rule["expr"], env.at):
            engines[(rule["record"], row["metric"]["instance"])].add(rule["labels"]["engine"])
    assert all(len(e) == 1 for e in engines.values()), {k: v for k, v in engines.items() if len(v) > 1}
    kv = {inst for (rec, inst) in engines if rec == RECORDS[Signal.KV_USAGE]}
    assert kv == set(EXPECTED) - {"triton-llmapi"}, kv
    assert engines[(RECORDS[Signal.KV_USAGE], "dynamo-worker-vllm")] == {"vllm"}
    proxy = [r for r in signal_rules() if r["record"] == RECORDS[Signal.KV_USAGE] and r["labels"].get("proxy")]
    assert {r["labels"]["engine"] for r in proxy} == {"tgi", "dynamo"}


def test_kv_proxies_are_marked_on_dashboards_and_in_verdicts(env: Env) -> None:
    client = PromClient(env.url)
    proxy_q = signal_expr(Signal.KV_USAGE, "", "1m", dialects=proxied(Signal.KV_USAGE))
    assert {r["metric"]["instance"] for r in client.instant(proxy_q, env.at)} == {"tgi", "dynamo-frontend"}
    measured_q = signal_expr(Signal.KV_USAGE, "", "1m", dialects=proxied(Signal.KV_USAGE, False))
    assert not {r["metric"]["instance"] for r in client.instant(measured_q, env.at)} & {"tgi", "dynamo-frontend"}
    settings = load_settings(None, environ={}, overrides={"prometheus": {"url": env.url}})
    ev = evaluate(client, settings, load_ruleset(), env.at)
    by_name = {r.target.key.instance: r for r in ev.results}
    assert "KV usage is a proxy" in by_name["tgi"].diagnoses[0].summary
    assert "KV usage is a proxy" not in by_name["lmdeploy"].diagnoses[0].summary
    blind = by_name["triton-llmapi"]
    assert blind.state.value == "unknown" and "LLM-API" in blind.diagnoses[0].summary


def test_llm_d_inference_sim_pods_are_excluded_by_the_documented_selector(env: Env) -> None:
    selector = '{image!~".*llm-d-inference-sim.*"}'
    from kvwatch.core.selector import parse_selector, render_matchers

    scoped = discover(PromClient(env.url), env.at, 1800.0, render_matchers(parse_selector(selector)))
    assert {t.key.instance for t in scoped} == set(EXPECTED) - {"llm-d-inference-sim"}
    doc = (Path(__file__).parents[1] / "docs" / "engines.md").read_text()
    assert selector in doc


def test_tgi_request_rate_counts_finished_requests_not_arrivals(env: Env) -> None:
    """TGI's router increments ``tgi_request_count`` when a request arrives and
    ``tgi_request_success`` when it completes: progress (and Little's law) needs the
    second, or a wedged TGI that keeps receiving requests looks like it serves them."""
    per_s = 5100 * 0.01 / 15  # the fixture's tgi_request_success grows 1 % per 15 s scrape
    assert _now(env, "tgi", Signal.REQUEST_RATE) == pytest.approx(per_s, rel=1e-6)


def test_tgi_forward_steps_are_its_decode_passes_not_its_prefills(env: Env) -> None:
    """TGI's router counts each forward pass as it starts it (``tgi_batch_inference_count``, by
    method): the decode passes are the step rate a wedge stops; prefills (one per admitted batch)
    are not steps of the running batch."""
    per_s = 90000 * 0.01 / 15  # the fixture's decode passes grow 1 % per 15 s scrape
    assert _now(env, "tgi", Signal.STEP_RATE) == pytest.approx(per_s, rel=1e-6)
