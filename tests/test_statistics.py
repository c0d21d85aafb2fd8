"""The statistics registry: one table, and its two implementations agree.

Every statistic with both a fleet kernel and a per-series implementation is
computed both ways on random matrices with NaN gaps, ±Inf, empty rows and rows
shorter than the slope/periodogram minimum; results must match (NaN ↔ None).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from kvwatch.core.rules import Leaf
from kvwatch.core.statistics.registry import REGISTRY, RULE_STATS, SpanMatrix
from kvwatch.core.statistics.series import MIN_SAMPLES, SeriesStats

BOTH = sorted(n for n, s in REGISTRY.items() if s.fleet is not None and s.series is not None)
ARGS: dict[str, tuple[float | None, ...]] = {
    "quantile": (0.0, 0.1, 0.37, 0.9, 1.0),
    "below_max": (None, 0.1, 0.5),
    "frac_above": (0.0, 0.5, 0.88),
    "frac_below": (0.1, 0.5),
    "frac_near_max": (None, 0.05, 0.2),
}


def _matrix(seed: int, rows: int = 40, cols: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """Values in [0, 1) (and some counts up to 50), 20 % NaN gaps, a few ±Inf, plus
    edge rows: all gaps, one sample, fewer than MIN_SAMPLES, constant, negative."""
    rng = np.random.default_rng(seed)
    m = rng.random((rows, cols))
    m[rows // 2 :] *= 50  # counts: frac_near_max's 1-unit floor matters here
    m[rng.random((rows, cols)) < 0.2] = np.nan
    m[rng.random((rows, cols)) < 0.02] = np.inf
    m[0] = np.nan
    m[1, :-1] = np.nan
    m[2, : cols - MIN_SAMPLES + 1] = np.nan
    m[3] = 0.42
    m[4] = -rng.random(cols)
    m[5, ::3] = np.nan  # regular gaps
    t = 1.7e9 + 30.0 * np.arange(cols)
    return m, t


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", BOTH)
def test_fleet_kernel_matches_per_series(name: str, seed: int) -> None:
    m, t = _matrix(seed)
    # FleetStats.matrix turns ±Inf into gaps before the kernels; SeriesStats drops them itself
    span = SpanMatrix(np.where(np.isfinite(m), m, np.nan), t)
    stat = REGISTRY[name]
    assert stat.fleet is not None and stat.series is not None
    for arg in ARGS.get(name, (None,)):
        with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            fleet = stat.fleet(span, arg)
        assert fleet.shape == (len(m),)
        for i, row in enumerate(m):
            one = stat.series(SeriesStats(t, row, len(row)), arg)
            got = float(fleet[i])
            where = f"{name}({arg}) row {i}"
            if one is None:
                assert math.isnan(got), f"{where}: fleet {got}, per series None"
            else:
                assert got == pytest.approx(one, rel=1e-6, abs=1e-9), where


def test_parity_covers_the_kernels_that_matter() -> None:
    """The vectorised statistics the rules lean on are all checked both ways."""
    assert {"mean", "max", "std", "last", "slope", "p90", "quantile", "frac_above",
            "frac_near_max", "coverage", "count"} <= set(BOTH)


def test_every_statistic_has_an_implementation() -> None:
    for name, stat in REGISTRY.items():
        assert stat.fleet is not None or stat.series is not None, name
        assert stat.name == name


def test_rule_validation_reads_the_registry() -> None:
    assert set(RULE_STATS) == {n for n, s in REGISTRY.items() if s.in_rules}
    assert "count" not in RULE_STATS  # internal: blind-spot checks
    for name, needs_arg in RULE_STATS.items():
        leaf = {"signal": "kv_usage", "stat": name, "op": ">", "value": 0.5}
        if needs_arg:
            with pytest.raises(ValueError, match="needs an 'arg'"):
                Leaf.model_validate(leaf)
            leaf["arg"] = 0.5
        assert Leaf.model_validate(leaf).stat == name
    with pytest.raises(ValueError, match="unknown stat 'count'"):
        Leaf.model_validate({"signal": "kv_usage", "stat": "count", "op": ">", "value": 0})


def test_fill_drain_counts_swings_relative_to_the_peak_and_sustained_cycles_need_two_samples() -> None:
    """A batch of 32 that drains to 4 twice is two fill-and-drain cycles whatever the unit;
    a queue seen for one scrape at a time is not a sustained pressure episode."""
    t = np.arange(12, dtype=float) * 30
    batch = SeriesStats(t, np.array([4, 30, 32, 32, 5, 4, 31, 32, 4, 4, 20, 24], dtype=float))
    assert REGISTRY["fill_drain"].series(batch, 0.5) == 2.0
    noise = SeriesStats(t, np.array([30, 32, 28, 31, 29, 32, 30, 28, 31, 32, 29, 30], dtype=float))
    assert REGISTRY["fill_drain"].series(noise, 0.5) == 0.0  # range under half the peak
    blips = SeriesStats(t, np.array([0, 3, 0, 0, 4, 0, 0, 2, 0, 0, 0, 0], dtype=float))
    held = SeriesStats(t, np.array([0, 3, 5, 0, 4, 6, 0, 2, 2, 0, 0, 0], dtype=float))
    assert REGISTRY["cycles"].series(blips, 1.0) == 3.0
    assert REGISTRY["sustained_cycles"].series(blips, 1.0) == 0.0
    assert REGISTRY["sustained_cycles"].series(held, 1.0) == 3.0
    # episodes also count the excursion under way: fill, drain, fill again = 2 while the refill lasts
    refill = SeriesStats(t, np.array([0, 3, 5, 0, 0, 0, 0, 0, 4, 6, 7, 8], dtype=float))
    assert REGISTRY["sustained_cycles"].series(refill, 1.0) == 1.0
    assert REGISTRY["sustained_episodes"].series(refill, 1.0) == 2.0
    assert REGISTRY["sustained_episodes"].series(blips, 1.0) == 0.0  # one-scrape blips still are not episodes
    refilling = SeriesStats(t, np.array([4, 30, 32, 32, 5, 4, 31, 32, 4, 4, 28, 30], dtype=float))
    assert REGISTRY["fill_drain"].series(refilling, 0.5) == 2.0
    assert REGISTRY["fill_drain_episodes"].series(refilling, 0.5) == 3.0


def test_pinned_tail_reads_how_long_the_current_ceiling_has_held() -> None:
    """A cap cut inside the span: 148 → 8 held for the last 8 of 12 samples is a new ceiling
    for 2/3 of the span, which frac_near_max over the whole span (max 150) cannot see."""
    t = np.arange(12, dtype=float) * 30
    cut = SeriesStats(t, np.array([148, 123, 150, 144, 8, 8, 8, 7, 8, 8, 8, 8], dtype=float))
    assert REGISTRY["pinned_tail"].series(cut, 0.02) == pytest.approx(8 / 12)  # 7 ↔ 8 is the 1-unit floor
    assert REGISTRY["frac_near_max"].series(cut, 0.02) == pytest.approx(2 / 12)  # 148 and 150 only
    varying = SeriesStats(t, np.array([20, 24, 17, 21, 25, 19, 22, 16, 23, 18, 24, 20], dtype=float))
    assert REGISTRY["pinned_tail"].series(varying, 0.02) == 0.0  # wanders around 20: no ceiling changed
    assert REGISTRY["pinned_tail"].series(SeriesStats(t, np.zeros(12)), 0.02) == 0.0  # nothing running


def test_last_above_marks_a_new_high_at_the_end_and_not_a_pinned_series() -> None:
    t = np.arange(6, dtype=float) * 30
    assert REGISTRY["last_above"].series(SeriesStats(t, np.array([4, 5, 4, 6, 4, 118], dtype=float)), None) == 1.0
    assert REGISTRY["last_above"].series(SeriesStats(t, np.full(6, 8.0)), None) == 0.0  # ties are not below
    assert REGISTRY["last_above"].series(SeriesStats(t[:1], np.array([3.0])), None) is None


def test_since_near_peak_reads_the_last_sample_at_a_share_of_the_span_maximum() -> None:
    """Peaks of 30 and 12 waiting, then one request caught 30 s before the end: at a tenth of
    the maximum (3) the last sample that counts is the 12, 210 s before the end; at a
    thirtieth the lone request counts. Nothing above 0 (or no samples) has no peak to scale by."""
    t = np.arange(12, dtype=float) * 30
    v = np.array([0, 30, 8, 0, 12, 0, 0, 0, 0, 0, 1, 0], dtype=float)
    st = SeriesStats(t, v)
    assert REGISTRY["since_near_peak"].series(st, 0.1) == 210.0
    assert REGISTRY["since_near_peak"].series(st, 1 / 30) == 30.0
    assert REGISTRY["since_near_peak"].series(st, 0.5) == 300.0
    assert REGISTRY["since_near_peak"].series(SeriesStats(t, np.zeros(12)), 0.1) is None
    assert REGISTRY["since_near_peak"].series(SeriesStats(t[:0], v[:0]), 0.1) is None


def test_quiet_before_last_reads_the_trough_behind_the_newest_peak() -> None:
    """Quiet (≤ arg/2) from 30 s, a rise at 270 s: the trough behind the newest peak is 240 s
    (a value between arg/2 and arg, at 90 s, neither ends the quiet nor rises); with two later
    peaks, only the trough behind the newest (180 s → 300 s) counts.
    Up since the span opened, or never reaching arg: no trough to read."""
    t = np.arange(12, dtype=float) * 30
    v = np.array([5, 0, 0, 0.7, 0, 0, 0, 0, 0, 3, 0, 0], dtype=float)
    assert REGISTRY["quiet_before_last"].series(SeriesStats(t, v), 1.0) == 240.0
    v2 = np.array([0, 2, 0, 0, 2, 2, 0, 0, 0, 0, 2, 0], dtype=float)
    assert REGISTRY["quiet_before_last"].series(SeriesStats(t, v2), 1.0) == 120.0
    assert REGISTRY["quiet_before_last"].series(SeriesStats(t, np.full(12, 3.0)), 1.0) is None
    assert REGISTRY["quiet_before_last"].series(SeriesStats(t, np.zeros(12)), 1.0) is None


def test_quiet_spacings_reads_the_quiet_time_in_the_series_own_cycle_spacing() -> None:
    """Episodes start every 4 samples (120 s); the last sample ≥ 1 is 120 s before the end:
    one spacing. A start needs 60 s at ≤ arg/2 before it, so the excursion under way when
    the span opens (or one after a single quiet scrape) has none; one start gives no
    spacing; a series that never reaches the threshold has no quiet time."""
    t = np.arange(12, dtype=float) * 30
    v = np.array([3, 0, 0, 5, 5, 0, 0, 4, 0, 0, 0, 0], dtype=float)
    st = SeriesStats(t, v)
    assert REGISTRY["since_above"].series(st, 1.0) == 120.0
    assert REGISTRY["quiet_spacings"].series(st, 1.0) == pytest.approx(120.0 / 120.0)
    v2 = np.array([0, 2, 0, 0, 2, 0, 0, 2, 0, 0, 0, 0], dtype=float)
    assert REGISTRY["quiet_spacings"].series(SeriesStats(t, v2), 1.0) == pytest.approx(120.0 / 90.0)
    # drained for one 30 s scrape mid-peak: the same episode (starts at 60 s and 240 s, not 60/120/240)
    dip = np.array([0, 0, 2, 0, 2, 0, 0, 0, 2, 0, 0, 0], dtype=float)
    assert REGISTRY["quiet_spacings"].series(SeriesStats(t, dip), 1.0) == pytest.approx(90.0 / 180.0)
    one = np.array([3, 3, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0], dtype=float)
    assert REGISTRY["quiet_spacings"].series(SeriesStats(t, one), 1.0) is None  # the first run has no start
    assert REGISTRY["since_above"].series(SeriesStats(t, np.zeros(12)), 1.0) is None
    assert REGISTRY["since_above"].series(SeriesStats(t, v2 + 1), 1.0) == 0.0


def test_spacing_cv_reads_how_regularly_the_episode_starts_recur() -> None:
    """Starts 120 s apart three times: a cycle, 0. Spacings of 90 and 240 s: their std / mean.
    Rises under ``arg`` (one request where arg is 2) are no starts; a start needs 60 s at
    ≤ arg/2 before it (a rise after one quiet scrape continues the episode); fewer than three
    starts give no spread."""
    t = np.arange(16, dtype=float) * 30
    v = np.array([0, 0, 3, 0, 0, 0, 3, 0, 0, 0, 3, 0, 0, 0, 3, 0], dtype=float)
    assert REGISTRY["spacing_cv"].series(SeriesStats(t, v), 2.0) == pytest.approx(0.0)
    odd = np.array([0, 0, 3, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0], dtype=float)
    odd2 = np.concatenate([odd[:15], [3]])  # a fourth start 60 s after the third
    gaps = np.array([90.0, 240.0])
    assert REGISTRY["spacing_cv"].series(SeriesStats(t, odd), 2.0) == pytest.approx(gaps.std() / gaps.mean())
    assert REGISTRY["spacing_cv"].series(SeriesStats(t, odd2), 2.0) == pytest.approx(gaps.std() / gaps.mean())
    ones = np.where(v > 0, 1.0, 0.0)
    assert REGISTRY["spacing_cv"].series(SeriesStats(t, ones), 2.0) is None  # one request: no rise
    assert REGISTRY["spacing_cv"].series(SeriesStats(t, ones), 1.0) == pytest.approx(0.0)
    two = np.array([0, 0, 3, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0], dtype=float)
    assert REGISTRY["spacing_cv"].series(SeriesStats(t, two), 2.0) is None


def test_since_below_is_how_long_a_queue_has_been_up_without_a_break() -> None:
    t = np.arange(8, dtype=float) * 30
    st = SeriesStats(t, np.array([5, 0, 3, 9, 12, 7, 8, 11], dtype=float))
    assert REGISTRY["since_below"].series(st, 0.5) == 180.0  # last empty at 30 s, the span ends at 210 s
    assert REGISTRY["since_below"].series(SeriesStats(t, np.zeros(8)), 0.5) == 0.0
    assert REGISTRY["since_below"].series(SeriesStats(t, np.full(8, 4.0)), 0.5) is None  # up all span
    assert REGISTRY["since_below"].series(SeriesStats(t[:0], t[:0]), 0.5) is None


def test_since_is_measured_at_the_span_end_when_the_last_samples_are_missing() -> None:
    """Held-out 109 110 (rnd-110-067, Triton wedged with no queue gauge): the queue-time mean is
    0/0 (NaN) once no request finishes, so its last finite sample, 9 s, was 14 minutes old, yet
    "since the last queue time of a second" read 0 s and the wedge passed for a cycle's recency.
    Seconds since are counted to the span's end (the evaluation instant); missing samples at
    the end are time that passed without the event being seen."""
    t = np.arange(10, dtype=float) * 30
    v = np.array([0, 2, 9, 9, np.nan, np.nan, np.nan, np.nan, np.nan, np.nan])
    assert REGISTRY["since_above"].series(SeriesStats(t, v), 1.0) == 180.0
    assert REGISTRY["since_below"].series(SeriesStats(t, v), 0.5) == 270.0
    assert REGISTRY["since_above"].series(SeriesStats(t, np.full(10, np.nan)), 1.0) is None


def test_held_drains_count_a_queue_emptied_for_a_minute_between_peaks_not_for_one_scrape() -> None:
    """Three peaks with the queue empty for 90 s between them: two held drains (the trailing
    quiet stretch starts no new peak). The same peaks with a single empty 30 s scrape between
    them (a cap binding all along): none. At 60 s scrapes on the 30 s grid one empty scrape
    spans 60 s and counts; an empty span has no answer."""
    t = np.arange(14, dtype=float) * 30
    held = np.array([9, 9, 0, 0, 0, 9, 9, 0, 0, 0, 9, 9, 0, 0], dtype=float)
    assert REGISTRY["held_drains"].series(SeriesStats(t, held), 1.0) == 2.0
    blip = np.array([9, 9, 0, 9, 9, 9, 0, 9, 9, 9, 0, 9, 9, 9], dtype=float)
    assert REGISTRY["held_drains"].series(SeriesStats(t, blip), 1.0) == 0.0
    slow = np.array([9, 9, 0, 0, 9, 9, 9, 9, 0, 0, 9, 9, 9, 9], dtype=float)
    assert REGISTRY["held_drains"].series(SeriesStats(t, slow), 1.0) == 2.0
    assert REGISTRY["held_drains"].series(SeriesStats(t[:0], held[:0]), 1.0) is None


def test_a_level_the_whole_span_wanders_around_is_no_new_ceiling() -> None:
    """Held-out corpus 63 64 (rnd-64-041, LMDeploy, a reservation stall): running wandered 28-31
    over the whole span and its last 11 samples sat within one unit, which pinned_tail read as a
    cap cut inside the span; the admission stall was then excluded from fragmented and the pool
    read unknown. Before a new ceiling the series sat elsewhere: where the samples before the
    suffix sit at the suffix's own level (median within the band), no ceiling changed."""
    t = np.arange(21, dtype=float) * 30
    wander = SeriesStats(t, np.array([30, 29, 31, 30, 28, 30, 29, 31, 28, 30,
                                      30, 29, 30, 30, 29, 30, 29, 30, 30, 29, 30], dtype=float))
    assert REGISTRY["pinned_tail"].series(wander, 0.02) == 0.0
    raised = SeriesStats(t, np.array([8] * 10 + [30, 29, 30, 30, 29, 30, 29, 30, 30, 29, 30], dtype=float))
    assert REGISTRY["pinned_tail"].series(raised, 0.02) == pytest.approx(11 / 21)  # a raised cap still is one
