"""Incremental evaluation for ``kvwatch run``: keep the window in memory, fetch what changed.

A full fetch re-evaluates the whole window (30 m) every cycle although only the
last interval is new. Prometheus evaluates a range query at each step
independently, so the value at step ``t`` depends only on samples at or before
``t``; once those have all arrived it never changes. Each cycle therefore
fetches only the steps since the last cycle plus ``evaluation.overlap`` (steps
whose samples may still arrive late: scrape duration, remote-write lag,
VictoriaMetrics' latency offset), shifts the kept window and splices the new
steps in. The result equals a full fetch at the same instant
(``tests/test_incremental.py`` checks this against a live-scraped simulator).

* Static signals (instant queries) are re-read every cycle: they are one value.
* Only the decision signals are kept and spliced (``RuleSet.decision_signals``); the
  triage-only ones are read afterwards, for the targets with a matched rule only, by
  :func:`kvwatch.core.pipeline.counted` (the same second pass as a full fetch's).
* A step ``overlap`` or more older than the last cycle's instant had settled then and is
  not read again: a steady cycle fetches its new steps and the overlap's unsettled ones.
* Latency quantiles sampled coarsely are sampled at fixed absolute instants
  (``core.collect.first_coarse_slot``), the same in the kept and the fetched part, and
  each sample is held over the steps after it again once spliced.
* Discovery runs again when the number of live engine series changes (one cheap
  ``count``), and at least every ``discovery.refresh_cycles`` cycles for changes
  a count cannot see (a model label renamed; a stale target leaving the window).
  Between those, a target that stopped shows up at once (its series go stale, so
  the count drops); targets whose discovery changed are fetched whole.
* The scrape interval (which widens rate windows) and each histogram's bucket layout
  (the bound a quantile clamps to) are measured with discovery, for the whole fleet
  as a full fetch measures them, and reused until the next discovery: both are
  configuration, and re-reading them every cycle cost more Prometheus CPU than the
  new steps. A change between discoveries shows up at the next one (at most
  ``discovery.refresh_cycles`` cycles late); ``once`` and ``backtest`` measure them on
  every evaluation.
* The first cycle, a gap longer than the window, or any change of the
  evaluation/discovery/shard settings or the rules' signals fetches everything.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from kvwatch.config import Settings
from kvwatch.core.collect import (
    _hold_forward,
    _hold_index,
    _latency_hold,
    first_coarse_slot,
    gc_paused,
    plan,
    query_modes,
    resolve,
)
from kvwatch.core.discover import fingerprint_query
from kvwatch.core.frame import FleetData
from kvwatch.core.models import Evaluation, Target, TargetKey
from kvwatch.core.pipeline import (
    Probes,
    collect_targets,
    counted,
    find_targets,
    measure_probes,
    scope_matchers,
)
from kvwatch.core.promclient import QueryClient
from kvwatch.core.rules import RuleSet
from kvwatch.core.scrape import rate_window
from kvwatch.core.signals import Signal
from kvwatch.durations import format_duration

Modes = dict[tuple[TargetKey, Signal], str]

_NO_ROWS: dict[Signal, np.ndarray] = {}


def signal_modes(targets: list[Target], settings: Settings, rules: RuleSet) -> Modes:
    """How collection fetched each (target, signal): ``static``, ``coarse`` or ``range``."""
    ev = settings.evaluation
    lw = format_duration(ev.latency_window)
    queries = plan(targets, "", format_duration(ev.rate_window), lw)
    by_query = query_modes(queries, rules.condition_signals(), lw, ev.step)
    return {(k, sig): by_query[q] for q, uses in queries.items() for sig, keys, _ in uses for k in keys}


def splice(old: FleetData, new: FleetData, grid: np.ndarray, modes: Modes, hold_src: np.ndarray) -> FleetData:
    """``old`` shifted onto ``grid`` with ``new`` (the last ``len(new.grid)`` steps of ``grid``) spliced in.

    ``grid[-1]`` must equal ``new.grid[-1]`` and ``old`` must cover every step of
    ``grid`` before ``new.grid[0]``. Rows absent from both stay absent, as in a full fetch.
    """
    n1 = len(grid)
    m0 = n1 - len(new.grid)
    k = int(np.rint((grid[-1] - old.grid[-1]) / (grid[1] - grid[0]))) if n1 > 1 else 0
    out = FleetData(grid=grid, targets=dict(new.targets), sourced=dict(new.sourced), ceilings=dict(new.ceilings),
                    buckets=dict(new.buckets),
                    rate_window_s=new.rate_window_s, scrape_interval_s=new.scrape_interval_s,
                    target_rate_window_s=dict(new.target_rate_window_s))
    # one matrix per (signal, mode): a few numpy calls instead of several per row. A steady
    # cycle splices ~13 rows per target: rows are paired through dict copies, which reuse the
    # stored hashes
    # (dict.fromkeys(set), d.update(d2)), and each output row is written through its target's
    # dict, so a row costs one mode lookup, one group lookup and one store.
    groups: dict[tuple[Signal, str], list[tuple[dict[Signal, np.ndarray], np.ndarray | None, np.ndarray | None]]]
    groups = defaultdict(list)
    for key in new.targets:
        olds, news = old.series.get(key, _NO_ROWS), new.series.get(key, _NO_ROWS)
        if not olds and not news:
            continue
        sigs = olds.keys() | news.keys()  # (its order is the signals' order in the output)
        prevs, fresh = dict.fromkeys(sigs), dict.fromkeys(sigs)  # same keys, same order: zipped below
        prevs.update(olds)
        fresh.update(news)
        dest: dict[Signal, np.ndarray] = {}
        out.series[key] = dest  # targets keep the order of a full fetch
        for (sig, prev), now in zip(prevs.items(), fresh.values(), strict=True):
            groups[(sig, modes.get((key, sig), "range"))].append((dest, prev, now))
    for (sig, mode), rows in groups.items():
        if mode == "static":  # one value held over the grid: the newest read is the whole row
            have = [(dest, now) for dest, _, now in rows if now is not None]
            held = np.repeat(np.array([now[-1] for _, now in have]).reshape(-1, 1), n1, axis=1)
            for (dest, _), row in zip(have, held, strict=True):
                dest[sig] = row
            continue
        mat = np.full((len(rows), n1), np.nan)
        kept = [i for i, (_, prev, _) in enumerate(rows) if prev is not None]
        if kept and m0 > 0:
            mat[kept, :m0] = np.stack([rows[i][1] for i in kept])[:, k : k + m0]  # type: ignore[misc]
        fetched = [i for i, (_, _, now) in enumerate(rows) if now is not None]
        if fetched:
            mat[fetched, m0:] = np.stack([rows[i][2] for i in fetched])  # type: ignore[misc]
        if mode == "coarse":
            # the samples sit on fixed absolute slots in both parts: hold each over the steps
            # after it again (the fetched span may start between two slots)
            mat = _hold_forward(mat, hold_src)
        for (dest, _, _), row in zip(rows, mat, strict=True):
            dest[sig] = row
    for key in [key for key, sigs in out.series.items() if not sigs]:
        del out.series[key]  # only static rows, none read now: absent, as in a full fetch
    return out


@dataclass
class IncrementalEvaluator:
    """Drop-in for :func:`kvwatch.core.pipeline.evaluate` that remembers the last window between calls."""

    #: what the last call did: "full", "incremental" or "" before the first call
    last_mode: str = ""
    #: steps fetched by the last call (the whole window on a full fetch)
    last_steps: int = 0
    last_discovered: bool = False
    _settings_key: Any = None
    _targets: list[Target] | None = None
    _fingerprint: float | None = None
    _since_discovery: int = 0
    _data: FleetData | None = None
    _modes: Modes = field(default_factory=dict)
    _probes: Probes | None = None

    def reset(self) -> None:
        self._targets, self._fingerprint, self._data, self._modes, self._probes = None, None, None, {}, None

    @property
    def data(self) -> FleetData | None:
        """The window kept in memory (the last evaluation's data)."""
        return self._data

    def __call__(self, client: QueryClient, settings: Settings, rules: RuleSet, at: datetime) -> Evaluation:
        """One service cycle, run with the cyclic GC paused (:func:`~kvwatch.core.collect.gc_paused`).

        A steady cycle allocates ~100,000 containers per 1,000 targets (decoded series,
        diagnosis records) and keeps few of them; collecting during the cycle re-traversed
        the survivors ~70 times and all long-lived objects about once (~0.11 s of CPU per
        cycle after collection's own pause, measured). Paused, the collector runs once
        after the cycle over what is left; cyclic garbage waits at most one cycle.
        """
        with gc_paused():
            return counted(client, settings, at, lambda: self._body(client, settings, rules, at), rules)

    @staticmethod
    def _windows(ev: Any, data: FleetData) -> tuple[float, float]:
        """(rate window, latency window) in seconds that ``data`` was fetched with."""
        rate = data.rate_window_s if data.rate_window_s else ev.rate_window
        return rate, rate_window(ev.latency_window, data.scrape_interval_s)

    def _discover(self, client: QueryClient, settings: Settings, at: datetime) -> list[Target]:
        rows = client.instant(fingerprint_query(scope_matchers(settings)), at)
        try:
            fp: float | None = float(rows[0]["value"][1]) if rows else 0.0
        except (KeyError, IndexError, TypeError, ValueError):
            fp = None  # unreadable: rediscover
        stale = self._since_discovery + 1 >= settings.discovery.refresh_cycles
        self.last_discovered = self._targets is None or fp is None or fp != self._fingerprint or stale
        if self.last_discovered:
            self._targets = find_targets(client, settings, at)
            self._fingerprint, self._since_discovery = fp, 0
        else:
            self._since_discovery += 1
        return list(self._targets or [])

    def _body(
        self, client: QueryClient, settings: Settings, rules: RuleSet, at: datetime
    ) -> tuple[list[Target], FleetData]:
        ev = settings.evaluation
        decide = rules.decision_signals()  # the triage-only signals follow in counted(), for flagged targets
        key = (ev, settings.discovery, settings.shard, scope_matchers(settings), rules.condition_signals(), decide)
        if key != self._settings_key:
            self.reset()
            self._settings_key = key
        targets = self._discover(client, settings, at)
        step, n = ev.step, int(ev.window // ev.step)
        end = at.timestamp()
        grid = end - step * np.arange(n, -1, -1, dtype=float)
        old, old_targets = self._data, (self._data.targets if self._data is not None else {})
        advanced = (end - old.grid[-1]) / step if old is not None else -1.0
        k = int(np.rint(advanced))
        # the new steps and the kept ones that had not settled when they were read: a step
        # ``overlap`` or more older than that instant had all its samples (m + 1 grid points)
        m = max(k + math.ceil(ev.overlap / step) - 1, 0)
        # the windows the kept data were fetched with (widened for slow scrapes, core/scrape.py)
        kept_windows = self._windows(ev, old) if old is not None else (ev.rate_window, ev.latency_window)
        hold = _latency_hold(format_duration(kept_windows[1]), step)
        # scrape interval and bucket layouts change rarely: measured with discovery, for the
        # whole fleet at once (as a full fetch measures them), and reused in between
        if self.last_discovered or self._probes is None:
            self._probes = measure_probes(client, settings, targets, at)
        probes = self._probes
        unchanged = [t for t in targets if old_targets.get(t.key) == t]
        changed = [t for t in targets if old_targets.get(t.key) != t]
        full = (
            old is None or len(old.grid) != n + 1 or k < 0 or abs(advanced - k) > 1e-6
            or m >= n or len(changed) > len(targets) // 2
        )
        short = None
        if not full:
            short = collect_targets(client, settings, rules, unchanged, at, window_s=m * step, probes=probes,
                                    signals=decide)
            # the measured scrape interval widened or narrowed the rate/latency windows: the kept
            # steps were computed with other windows, so nothing can be spliced
            full = self._windows(ev, short) != kept_windows
        if not full:
            assert old is not None and short is not None
            # a target's own window (scraped slower than the fleet) changed with its measured
            # interval: its kept steps were read with the other window, so it is fetched whole
            moved = [t for t in unchanged
                     if old.target_rate_window_s.get(t.key) != short.target_rate_window_s.get(t.key)]
            changed += moved
            full = len(changed) > len(targets) // 2
        if full:
            data = collect_targets(client, settings, rules, targets, at, probes=probes, signals=decide)
            self._modes = signal_modes(targets, settings, rules)
            self.last_mode, self.last_steps = "full", n
        else:
            assert old is not None and short is not None
            if changed:
                self._modes = signal_modes(targets, settings, rules)
            hold_src = _hold_index(n + 1, first_coarse_slot(grid, step, hold), hold)
            data = splice(old, short, grid, self._modes, hold_src)
            if changed:  # new or re-discovered targets: their whole window, only their series
                whole = collect_targets(client, settings, rules, changed, at, only_these=True, probes=probes,
                                        signals=decide)
                data.series.update(whole.series)
                data.targets.update(whole.targets)
                data.ceilings.update(whole.ceilings)
                data.buckets.update(whole.buckets)
                for t in changed:  # their own windows as this fetch measured them
                    data.target_rate_window_s.pop(t.key, None)
                data.target_rate_window_s.update(whole.target_rate_window_s)
            for t in targets:
                data.sourced[t.key] = set(resolve(t))
            data.targets = {t.key: t for t in targets}
            # relabel leftovers found in this cycle's fetches: the triage pass reads its signals
            # at the instant, inside the span just probed, and need not probe again
            data.leftovers = short.leftovers or frozenset()
            if changed:
                data.leftovers |= whole.leftovers or frozenset()
            self.last_mode, self.last_steps = "incremental", m
        self._data = data
        return targets, data
