"""Perturbed copies of simulated targets: signals dropped, coarser scrapes, gaps, resets, churn.

Each :class:`Variant` is written as its own Prometheus ``job`` (``<job>-<variant>``) with the
same instances, so one backfill and one evaluation score every perturbation. What a
dialect exports for each optional signal is stated in :data:`OPTIONAL` (family name and,
for Triton's multiplexed families, the label value); dropping a signal removes exactly
those series. :func:`lacking` says which signals a target of a variant cannot show, which
is what the honest scorer's exemptions are computed from.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvwatch.sim.expose import Family, Labels, escape, families, label_text
from kvwatch.sim.fleet import DEFAULT_PORT, TargetRun, seed_of
from kvwatch.sim.openmetrics import _om_header
from kvwatch.sim.vocab import Dialect

#: optional signal -> per engine family: exported families, each ``name`` or ``name{label=value}``
_VLLM = {
    "waiting": ("vllm:num_requests_waiting", "vllm:num_requests_waiting_by_reason"),
    "preemptions": ("vllm:num_preemptions_total",),
    "running": ("vllm:num_requests_running",),
    "token_counters": ("vllm:generation_tokens_total", "vllm:prompt_tokens_total",
                       "vllm:avg_generation_throughput_toks_per_s", "vllm:avg_prompt_throughput_toks_per_s"),
    "ttft": ("vllm:time_to_first_token_seconds",),
    "request_counters": ("vllm:request_success_total",),
    "queue_time": ("vllm:request_queue_time_seconds",),
    "capacity": ("vllm:cache_config_info",),
}


def _sglang(p: str) -> dict[str, tuple[str, ...]]:
    return {
        "waiting": (f"{p}num_queue_reqs",), "preemptions": (f"{p}num_retracted_requests_total",),
        "running": (f"{p}num_running_reqs",),
        "token_counters": (f"{p}generation_tokens_total", f"{p}prompt_tokens_total", f"{p}gen_throughput"),
        "ttft": (f"{p}time_to_first_token_seconds",), "request_counters": (f"{p}num_requests_total",),
        "queue_time": (f"{p}queue_time_seconds",), "capacity": (f"{p}max_total_num_tokens",),
    }


_TRITON = {
    "waiting": ("nv_trt_llm_request_metrics{request_type=waiting}", "nv_inference_pending_request_count"),
    "preemptions": ("nv_trt_llm_inflight_batcher_metrics{inflight_batcher_specific_metric=paused_requests}",),
    "running": ("nv_trt_llm_request_metrics{request_type=scheduled}",),
    "token_counters": ("nv_llm_input_token_len", "nv_llm_output_token_len"),  # Triton before nv_llm_*
    "ttft": (),
    "request_counters": ("nv_inference_request_success", "nv_inference_count"),
    "queue_time": ("nv_inference_queue_duration_us",),
    "capacity": ("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}",
                 "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}"),
}
_SERVE = {
    "waiting": ("trtllm_num_requests_waiting",), "preemptions": ("trtllm_num_paused_requests",),
    "running": ("trtllm_num_requests_running", "trtllm_num_scheduled_requests"),
    "token_counters": ("trtllm_generation_tokens_total", "trtllm_prompt_tokens_total"),
    "ttft": ("trtllm_time_to_first_token_seconds",), "request_counters": ("trtllm_request_success_total",),
    "queue_time": ("trtllm_request_queue_time_seconds",),
    "capacity": ("trtllm_kv_cache_max_blocks", "trtllm_kv_cache_tokens_per_block"),
}
_LMDEPLOY = {
    "waiting": ("lmdeploy:num_requests_waiting",), "preemptions": (),
    "running": ("lmdeploy:num_requests_running",),
    "token_counters": ("lmdeploy:generation_tokens_total", "lmdeploy:prompt_tokens_total"),
    "ttft": ("lmdeploy:time_to_first_token_seconds",), "request_counters": ("lmdeploy:request_success_total",),
    "queue_time": ("lmdeploy:request_queue_time_seconds",), "capacity": (),
}
_TGI = {
    "waiting": ("tgi_queue_size",), "preemptions": (), "running": ("tgi_batch_current_size",),
    "token_counters": ("tgi_request_generated_tokens", "tgi_request_input_length"), "ttft": (),
    "request_counters": ("tgi_request_count", "tgi_request_success", "tgi_request_failure"),
    "queue_time": ("tgi_request_queue_duration",), "capacity": ("tgi_batch_max_total_tokens",),
}
_DYNAMO_FRONTEND = {
    "waiting": ("dynamo_frontend_queued_requests",), "preemptions": (),
    "running": ("dynamo_frontend_inflight_requests",),
    "token_counters": ("dynamo_frontend_output_tokens_total", "dynamo_frontend_input_sequence_tokens"),
    "ttft": ("dynamo_frontend_time_to_first_token_seconds",), "request_counters": ("dynamo_frontend_requests_total",),
    "queue_time": (), "capacity": ("dynamo_frontend_model_total_kv_blocks",),
}
_DYNAMO_WORKER = {
    "waiting": (), "preemptions": (), "running": ("dynamo_component_inflight_requests",), "token_counters": (),
    "ttft": (), "request_counters": ("dynamo_component_requests_total", "dynamo_component_errors_total"),
    "queue_time": (), "capacity": (),
}
OPTIONAL_SIGNALS: tuple[str, ...] = tuple(_VLLM)


def optional_families(dialect: Dialect) -> dict[str, tuple[str, ...]]:
    """Optional signal -> the series that carry it in ``dialect``."""
    if dialect is Dialect.VLLM_RAY:  # Ray Serve: ray_ + the name sanitised for OpenTelemetry
        return {k: tuple("ray_" + n.replace(":", "_") for n in v) for k, v in _VLLM.items()}
    if dialect.engine == "vllm":
        return _VLLM
    if dialect is Dialect.SGLANG_RAY:
        return _sglang("ray_sglang_")
    if dialect.engine == "sglang":
        return _sglang("sglang:")
    if dialect is Dialect.LMDEPLOY:
        return _LMDEPLOY
    if dialect is Dialect.TGI:
        return _TGI
    if dialect is Dialect.DYNAMO_FRONTEND:
        return _DYNAMO_FRONTEND
    if dialect is Dialect.DYNAMO_WORKER:
        return _DYNAMO_WORKER
    return _TRITON if dialect is Dialect.TRTLLM_TRITON else _SERVE


#: what a dialect does not export at all (the simulator renders each version's real names)
_NOT_EXPORTED: dict[Dialect, frozenset[str]] = {
    Dialect.TRTLLM_TRITON: frozenset({"ttft"}),
    Dialect.SGLANG_0_4_0: frozenset({"preemptions", "request_counters", "queue_time", "capacity"}),
    Dialect.TRTLLM_SERVE_GEN_A: frozenset({"kv_usage", "waiting", "preemptions", "running", "token_counters",
                                           "capacity"}),
    Dialect.LMDEPLOY: frozenset({"preemptions", "capacity"}),  # neither is exported (loggers.py)
    Dialect.TGI: frozenset({"preemptions", "ttft"}),  # no preemption count, no TTFT histogram
    Dialect.DYNAMO_FRONTEND: frozenset({"preemptions", "queue_time"}),
    Dialect.DYNAMO_WORKER: frozenset({"waiting", "preemptions", "token_counters", "ttft", "queue_time",
                                      "capacity"}),
}


#: optional signals whose loss also takes KV usage away: TGI and Dynamo's frontend export no
#: KV gauge, their KV usage is a proxy divided by the capacity gauge (kvwatch/core/dialects)
_KV_OVER: dict[Dialect, frozenset[str]] = {
    Dialect.TGI: frozenset({"capacity"}),
    Dialect.DYNAMO_FRONTEND: frozenset({"capacity"}),
}


@dataclass(frozen=True)
class Variant:
    """One perturbation: ``drop`` an optional signal, keep every ``every``-th scrape (15 s
    base: 2 → 30 s, 4 → 60 s), cut scrape ``gaps``, ``reset`` counters once, ``churn`` a label,
    scrape at a ``phase`` of the target's own (see :class:`_Phase`)."""

    name: str
    drop: str | None = None
    every: int = 1
    gaps: bool = False
    reset: bool = False
    churn: bool = False
    phase: bool = False


BASE = Variant("base")
SCRAPES = (Variant("scrape-30s", every=2), Variant("scrape-60s", every=4), Variant("phase", phase=True))
FAULTS = (Variant("gaps", gaps=True), Variant("reset", reset=True), Variant("churn", churn=True))
DROPS = tuple(Variant(f"no-{s}", drop=s) for s in OPTIONAL_SIGNALS)
ALL = (BASE, *DROPS, *SCRAPES, *FAULTS)


def lacking(dialect: Dialect, variant: Variant) -> frozenset[str]:
    """Signals a target of ``dialect`` cannot show in ``variant`` (kv_usage included)."""
    out = set(_NOT_EXPORTED.get(dialect, frozenset()))
    if variant.drop:
        out.add(variant.drop)
        if variant.drop in _KV_OVER.get(dialect, frozenset()):
            out.add("kv_usage")
    return frozenset(out)


def _dropped(fam: Family, patterns: Iterable[str]) -> list[int] | None:
    """Indices of ``fam``'s samples to drop (None: the whole family)."""
    idx: list[int] = []
    for pat in patterns:
        name, _, sel = pat.partition("{")
        if name != fam.name:
            continue
        if not sel:
            return None
        key, _, value = sel.rstrip("}").partition("=")
        idx.extend(i for i, s in enumerate(fam.samples) if dict(s.labels).get(key) == value)
    return idx


def _keep_mask(run: TargetRun, variant: Variant) -> np.ndarray:
    n = len(run.wall_times)
    keep = np.zeros(n, dtype=bool)
    keep[np.arange(n - 1, -1, -variant.every)] = True  # the last scrape stays at the end instant
    if variant.gaps:
        rng = np.random.default_rng(seed_of(run.spec.name, "gaps"))
        step = float(run.wall_times[1] - run.wall_times[0]) if n > 1 else 15.0
        for _ in range(2):  # two outages of 1.5-4 min, anywhere but the last scrape
            length = int(rng.uniform(90, 240) / step)
            start = int(rng.integers(0, max(n - length - 1, 1)))
            keep[start:start + length] = False
    return keep


@dataclass(frozen=True)
class _Phase:
    """Where a target's scrapes land when Prometheus scrapes it at its own phase: ``offset``
    seconds (0-1 interval) after each simulated instant, each ±10 % of the interval early or
    late (jitter). Values are read at the shifted instant from the simulated ones: counters
    (and histogram buckets, which stay cumulative) interpolated, gauges from the nearer
    instant, so a scrape sees the state of its own time give or take half an interval."""

    offset: float
    step: float
    jitter: np.ndarray

    @staticmethod
    def of(run: TargetRun, ts: np.ndarray) -> _Phase | None:
        if len(ts) < 2:
            return None
        step = float(ts[1] - ts[0])
        rng = np.random.default_rng(seed_of(run.spec.name, "phase"))
        return _Phase(float(rng.uniform(0.0, step)), step, rng.uniform(-0.1, 0.1, len(ts)) * step)

    def times(self, ts: np.ndarray) -> np.ndarray:
        return np.round(ts + self.offset + self.jitter, 3)

    def values(self, v: np.ndarray, counter: bool) -> np.ndarray:
        if counter:
            frac = self.offset / self.step
            nxt = np.append(v[1:], v[-1])
            return v + frac * (nxt - v)
        shift = 1 if self.offset > self.step / 2 else 0
        return np.append(v[shift:], np.repeat(v[-1:], shift))


def _values(value: object, n: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(value, dtype=float), (n,)).copy()


def _counter_like(fam: Family) -> bool:
    return fam.kind in ("counter", "histogram")


Row = tuple[str, np.ndarray, np.ndarray, tuple[object, ...]]  # prefix, values, epoch s, series group


def target_series(run: TargetRun, variant: Variant, job: str, port: int = DEFAULT_PORT
                  ) -> Iterable[tuple[Family, list[Row]]]:
    """Per family of the variant: (sample prefix, values, epoch seconds, group) rows to write;
    a histogram's rows with the same group are one histogram."""
    dialect = run.spec.dialect
    patterns = optional_families(dialect).get(variant.drop, ()) if variant.drop else ()
    keep = _keep_mask(run, variant)
    ts = np.round(run.wall_times, 3)
    phase = _Phase.of(run, ts) if variant.phase else None
    rng = np.random.default_rng(seed_of(run.spec.name, "perturb"))
    n = len(ts)
    cut = n - 1 - int(rng.uniform(5 * 60, 25 * 60) / max(float(ts[1] - ts[0]), 1.0)) if n > 1 else 0
    churn_at = n - 1 - int(rng.uniform(15 * 60, 25 * 60) / max(float(ts[1] - ts[0]), 1.0)) if n > 1 else 0
    if phase is not None:
        ts = phase.times(ts)
    target: Labels = (("instance", run.spec.instance(port)), ("job", job))
    for fam in families(dialect, run.views(), run.spec.model_name):
        drop = _dropped(fam, patterns) if patterns else []
        if drop is None:
            continue
        rows: list[Row] = []
        for i, s in enumerate(fam.samples):
            if i in drop:
                continue
            v = _values(s.value, n)
            if phase is not None:
                v = phase.values(v, _counter_like(fam))
            if variant.reset and _counter_like(fam) and 0 < cut < n:
                v[cut:] -= v[cut - 1]  # the exporter restarted: counting starts again from 0
                v[cut:] = np.maximum(v[cut:], 0.0)
            group = tuple(kv for kv in s.labels if kv[0] != "le")
            if variant.churn and 0 < churn_at < n:
                idx = np.arange(n)
                for part, m in (("a", keep & (idx < churn_at)), ("b", keep & (idx >= churn_at))):
                    labels = (*target, *s.labels, ("pod_hash", f"h{part}"))
                    rows.append((f"{s.name}{label_text(labels)} ", v[m], ts[m], (*group, part)))
            else:
                rows.append((f"{s.name}{label_text((*target, *s.labels))} ", v[keep], ts[keep], group))
        yield fam, rows


def variant_runs(runs: Sequence[TargetRun], variant: Variant, share: float) -> list[TargetRun]:
    """The runs written under ``variant``: all for the base, else a seeded ``share`` of them
    (for a dropped signal, of those whose dialect exports it)."""
    if variant == BASE or share >= 1.0:
        return list(runs)
    out = []
    for run in runs:
        if variant.drop and variant.drop in lacking(run.spec.dialect, BASE):
            continue
        if np.random.default_rng(seed_of(run.spec.name, variant.name)).random() < share:
            out.append(run)
    return out


def write_variants(runs: Sequence[TargetRun], variants: Sequence[Variant], path: str | Path, *,
                   job: str, port: int = DEFAULT_PORT, share: float = 1.0) -> dict[str, list[str]]:
    """Write the runs under every variant (job ``<job>-<variant>``) as OpenMetrics, a seeded
    ``share`` of them for the perturbed variants; returns variant -> instances written.
    Families stay contiguous as promtool requires."""
    per_name: dict[str, list[tuple[Family, list[Row]]]] = {}
    written: dict[str, list[str]] = {}
    for variant in variants:
        chosen = variant_runs(runs, variant, share)
        written[variant.name] = [r.spec.instance(port) for r in chosen]
        for run in chosen:
            for fam, rows in target_series(run, variant, f"{job}-{variant.name}", port):
                per_name.setdefault(fam.name, []).append((fam, rows))
    with Path(path).open("w", encoding="utf-8") as out:
        for members in per_name.values():
            name, kind = _om_header(members[0][0])
            out.write(f"# TYPE {name} {kind}\n# HELP {name} {escape(members[0][0].help)}\n")
            for fam, rows in members:
                if fam.kind == "histogram":  # a histogram's points must be written together
                    groups: dict[tuple[object, ...], list[Row]] = {}
                    for row in rows:
                        groups.setdefault(row[3], []).append(row)
                    for group in groups.values():
                        cols = [(prefix, v.tolist(), t.tolist()) for prefix, v, t, _ in group]
                        for j in range(len(cols[0][2])):
                            out.writelines(f"{prefix}{v[j]!r} {_ts(t[j])}\n" for prefix, v, t in cols)
                else:
                    for prefix, v, t, _ in rows:
                        out.writelines(f"{prefix}{x!r} {_ts(y)}\n" for x, y in zip(v.tolist(), t.tolist(), strict=True))
        out.write("# EOF\n")
    return written


def _ts(t: float) -> str:
    return str(int(t)) if t == int(t) else f"{t:.3f}"
