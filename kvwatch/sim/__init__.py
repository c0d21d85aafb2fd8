"""Simulator of LLM inference engines (vLLM, SGLang, TensorRT-LLM) with a paged KV pool.

A mechanistic engine model (``engine``) runs scenario presets labelled with the failure mode
they must show (``scenarios``, checked against ground truth by ``validate``) and exports the
real metric names of each engine version (``expose``): as OpenMetrics for promtool backfill
(``openmetrics``, ``corpus``) or live over HTTP (``server``). CLI: ``kvwatch simulate``.
"""

from __future__ import annotations

from kvwatch.sim.corpus import build_corpus, default_end_time, plan, run_fleet
from kvwatch.sim.engine import Engine, EngineConfig
from kvwatch.sim.expose import exposition, families
from kvwatch.sim.fleet import TargetRun, TargetSpec, make_targets, simulate
from kvwatch.sim.openmetrics import backfill, write_openmetrics
from kvwatch.sim.scenarios import PRESETS, schedule
from kvwatch.sim.server import SimFleet, SimHTTPServer
from kvwatch.sim.validate import oracle, validate, validate_group, window_stats
from kvwatch.sim.vocab import Dialect, IdleCause, Mode
from kvwatch.sim.workload import Workload

__all__ = [
    "PRESETS", "Dialect", "Engine", "EngineConfig", "IdleCause", "Mode", "SimFleet",
    "SimHTTPServer", "TargetRun", "TargetSpec", "Workload", "backfill", "build_corpus",
    "default_end_time", "exposition", "families", "make_targets", "oracle", "plan",
    "run_fleet", "schedule", "simulate", "validate", "validate_group", "window_stats",
    "write_openmetrics",
]
