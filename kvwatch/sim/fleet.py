"""Targets (engine instances with a dialect and a scenario) and running them to traces."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from kvwatch.sim.engine import Engine, EngineConfig
from kvwatch.sim.scenarios import PRESETS, BuildContext, Replica, sample_base
from kvwatch.sim.trace import EngineView, Recorder, Trace
from kvwatch.sim.vocab import Dialect, IdleCause, Mode

DEFAULT_PORT = 8000


def seed_of(*parts: object) -> list[int]:
    """Stable RNG seed material from ints and strings."""
    return [p if isinstance(p, int) else zlib.crc32(str(p).encode()) for p in parts]


@dataclass(frozen=True)
class TargetSpec:
    """One scraped engine instance: its scenario replica, dialect and identity."""

    name: str  # also the Prometheus instance label (with the port)
    preset: str
    dialect: Dialect
    seed: int
    replica: Replica
    model_name: str
    group: str | None = None  # multi-replica presets: the shared model/deployment
    group_expected: Mode | None = None
    data_parallel: int = 1  # engines behind the instance (vLLM ``engine`` label)
    restart_at_s: float | None = None  # simulated process restart (counter reset), run time

    @property
    def expected(self) -> Mode:
        return self.replica.expected

    @property
    def cause(self) -> IdleCause | None:
        return self.replica.cause

    @property
    def config(self) -> EngineConfig:
        return self.replica.segments[-1].config

    def instance(self, port: int = DEFAULT_PORT) -> str:
        return f"{self.name}:{port}"


def make_targets(preset: str, dialect: Dialect | str, seed: int, *, run_s: float | None,
                 data_parallel: int = 1, restart_at_s: float | None = None
                 ) -> list[TargetSpec]:
    """Build the target(s) of ``preset`` for one dialect and seed (``run_s``: run length, s)."""
    dialect = Dialect(dialect)
    spec = PRESETS[preset]
    rng = np.random.default_rng(seed_of(seed, preset))
    ctx = BuildContext(sample_base(rng, dialect.engine), rng, run_s)
    replicas = spec.build(ctx)
    stem = f"sim-{preset}-{dialect.value}-{seed}"
    model = f"kvwatch-sim/{preset}-s{seed}"
    if len(replicas) == 1:
        return [TargetSpec(stem, preset, dialect, seed, replicas[0], model,
                           data_parallel=data_parallel, restart_at_s=restart_at_s)]
    return [TargetSpec(f"{stem}-r{i}", preset, dialect, seed, r, model, group=stem,
                       group_expected=spec.expected, data_parallel=data_parallel,
                       restart_at_s=restart_at_s) for i, r in enumerate(replicas)]


@dataclass(frozen=True)
class TargetRun:
    """A simulated target: ground truth per engine and the scrape instants."""

    spec: TargetSpec
    traces: tuple[Trace, ...]  # one per data-parallel engine
    sim_times: np.ndarray  # scrape instants, s since engine start
    wall_times: np.ndarray  # the same instants, s since the Unix epoch
    run_s: float = field(default=0.0)

    def views(self) -> list[EngineView]:
        return [tr.view(self.wall_times) for tr in self.traces]


def simulate(spec: TargetSpec, *, duration_s: float, end_time: float, warmup_s: float = 300.0,
             scrape_interval_s: float = 15.0) -> TargetRun:
    """Run ``warmup_s + duration_s`` of simulated time; scrape every ``scrape_interval_s``.

    Scrapes cover the last ``duration_s`` and the last one is stamped ``end_time`` (epoch s).
    """
    dt = spec.config.dt
    steps = round((warmup_s + duration_s) / dt)
    stride = round(scrape_interval_s / dt)
    first = round(warmup_s / dt)  # steps done before the first scrape
    traces = []
    for e in range(spec.data_parallel):
        segments = spec.replica.segments
        rec = Recorder()
        engine = Engine(segments[0].config, segments[0].workload,
                        seed=seed_of(spec.seed, spec.name, e), recorder=rec)
        nxt = 1
        restart_step = (None if spec.restart_at_s is None
                        else round(spec.restart_at_s / dt))
        for i in range(steps):
            while nxt < len(segments) and segments[nxt].start_s <= i * dt:
                engine.reconfigure(segments[nxt].config, segments[nxt].workload)
                nxt += 1
            if i == restart_step:
                engine.restart()
            engine.step()
            done = i + 1
            if done >= first and (done - first) % stride == 0:
                rec.snapshot_hist(engine.hist)
        traces.append(rec.trace(engine.cfg, engine.hist))
    n_scrapes = len(traces[0].hist_idx)
    offsets = np.arange(n_scrapes) * scrape_interval_s
    sim_times = warmup_s + offsets
    wall_times = end_time - duration_s + offsets
    return TargetRun(spec, tuple(traces), sim_times, wall_times, warmup_s + duration_s)
