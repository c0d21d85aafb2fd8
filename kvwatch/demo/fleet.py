"""The demo fleet: every simulator preset, each on one engine dialect, run to the end instant.

Both demo backends simulate this same fleet (same specs, seeds and dynamics); they
differ only in how kvwatch reads it. Presets rotate over :data:`DEMO_DIALECTS`, so
three engine families and several metric generations show up, each with its real
blind spots. Runs are sequential: the whole fleet is ~10 s of CPU, and one process
means Ctrl-C stops it at once with nothing to reap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvwatch.core.models import TargetKey
from kvwatch.sim.fleet import DEFAULT_PORT, TargetRun, TargetSpec, make_targets, simulate
from kvwatch.sim.scenarios import PRESETS
from kvwatch.sim.vocab import Dialect

#: scrape interval of the simulated fleet, s (Prometheus' common default)
SCRAPE_S = 15.0
#: Prometheus ``job`` label of every demo target
DEMO_JOB = "kvwatch-demo"
#: presets a demo runs: every failure mode, idle sub-cause and both misread shapes
DEMO_PRESETS: tuple[str, ...] = tuple(PRESETS)
#: dialects the presets rotate over (preset i speaks ``DEMO_DIALECTS[i % len]``)
DEMO_DIALECTS: tuple[Dialect, ...] = (
    Dialect.VLLM_0_10,
    Dialect.SGLANG_0_5,
    Dialect.TRTLLM_SERVE,
    Dialect.VLLM_0_33,
    Dialect.SGLANG_0_4_0,
)

Progress = Callable[[str], None]


def expected_label(spec: TargetSpec) -> str:
    """The mode a target's scenario was built to show, e.g. ``idle (stalled)``."""
    return spec.expected.value + (f" ({spec.cause.value})" if spec.cause else "")


def target_key(spec: TargetSpec, job: str = DEMO_JOB) -> TargetKey:
    return TargetKey(job, spec.instance(DEFAULT_PORT))


def plan(seed: int, run_s: float, presets: Sequence[str] = DEMO_PRESETS,
         dialects: Sequence[Dialect] = DEMO_DIALECTS) -> list[TargetSpec]:
    """Targets of the demo fleet (multi-replica presets give several); ``run_s``: run length, s."""
    specs: list[TargetSpec] = []
    for i, preset in enumerate(presets):
        specs.extend(make_targets(preset, dialects[i % len(dialects)], seed, run_s=run_s))
    return specs


@dataclass(frozen=True)
class DemoFleet:
    """Simulated runs, scraped every ``scrape_s`` up to ``end_time`` (epoch s)."""

    runs: tuple[TargetRun, ...]
    end_time: float
    scrape_s: float
    job: str = DEMO_JOB

    def expected(self) -> dict[str, str]:
        """``job/instance`` → expected mode label."""
        return {str(target_key(r.spec, self.job)): expected_label(r.spec) for r in self.runs}

    def groups(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """Multi-replica scenarios: group → (the mode the group shows, e.g. a misread
        fleet mean, and its members' ``job/instance``)."""
        modes: dict[str, str] = {}
        members: dict[str, list[str]] = {}
        for r in self.runs:
            spec = r.spec
            if spec.group and spec.group_expected:
                modes[spec.group] = spec.group_expected.value
                members.setdefault(spec.group, []).append(str(target_key(spec, self.job)))
        return {g: (modes[g], tuple(m)) for g, m in members.items()}


def simulate_fleet(seed: int, *, duration_s: float, warmup_s: float, scrape_s: float,
                   end_time: float, progress: Progress = lambda _: None,
                   presets: Sequence[str] = DEMO_PRESETS,
                   dialects: Sequence[Dialect] = DEMO_DIALECTS) -> DemoFleet:
    """Run every target for ``warmup_s + duration_s`` simulated s; scrapes cover the last
    ``duration_s`` and the last is stamped ``end_time``. Deterministic per seed: the
    dynamics do not depend on ``scrape_s``."""
    specs = plan(seed, warmup_s + duration_s, presets, dialects)
    runs: list[TargetRun] = []
    for i, spec in enumerate(specs):
        progress(f"[{i + 1}/{len(specs)}] simulating {spec.preset} ({spec.dialect.value})")
        runs.append(simulate(spec, duration_s=duration_s, end_time=end_time, warmup_s=warmup_s,
                             scrape_interval_s=scrape_s))
    return DemoFleet(tuple(runs), end_time, scrape_s)
