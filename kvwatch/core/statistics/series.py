"""Per-series statistics: one signal of one target over one span.

A :class:`SeriesStats` wraps the samples of one signal over one span (NaN and
±Inf already dropped) and computes statistics lazily, so a rule that never asks
for a periodogram never pays for one. All functions return ``None`` when there
are no samples, never 0: a missing value must not read as "fine".

Production asks this class only for what needs a walk along one series
(swings, cycles, the periodogram); the simple statistics here are the reference
implementations that the vectorised kernels of
:mod:`kvwatch.core.statistics.registry` are tested against.
"""

from __future__ import annotations

import math

import numpy as np

#: minimum samples for variability / periodicity statistics to mean anything
MIN_SAMPLES = 4


def _memo(fn):  # type: ignore[no-untyped-def]
    """Cache a zero-argument method's result on the instance (functools.cached_property
    takes a lock on every access in Python 3.11, which dominates on 60-sample series)."""
    name = fn.__name__

    def get(self):  # type: ignore[no-untyped-def]
        memo = self._memo
        if name not in memo:
            memo[name] = fn(self)
        return memo[name]

    return property(get, doc=fn.__doc__)


class SeriesStats:
    """Statistics of samples ``values`` taken at times ``ts`` (Unix seconds), oldest first."""

    __slots__ = ("_memo", "end", "expected", "ts", "v")

    def __init__(self, ts: np.ndarray, values: np.ndarray, expected: int = 0) -> None:
        # the span's last instant, whether or not it holds a sample: "seconds since" is
        # measured to it, so missing samples at the end count as time passed unseen
        self.end = float(ts[-1]) if len(ts) else float("nan")
        ok = np.isfinite(values)
        if ok.all():
            self.ts, self.v = ts, values
        else:
            self.ts, self.v = ts[ok], values[ok]
        self.expected = max(expected, len(values))
        self._memo: dict[str, object] = {}

    def __len__(self) -> int:
        return len(self.v)

    @property
    def coverage(self) -> float:
        """Fraction of expected samples present (1.0 = no scrape gaps)."""
        return len(self.v) / self.expected if self.expected else 0.0

    def _agg(self, fn: str) -> float | None:
        if not len(self.v):
            return None
        return float(getattr(np, fn)(self.v))

    @_memo
    def mean(self) -> float | None:
        return float(self.v.sum()) / len(self.v) if len(self.v) else None

    @_memo
    def max(self) -> float | None:
        return self._agg("max")

    @_memo
    def min(self) -> float | None:
        return self._agg("min")

    @_memo
    def median(self) -> float | None:
        return self.quantile(0.5)

    @_memo
    def std(self) -> float | None:
        return self._agg("std")

    @property
    def last(self) -> float | None:
        return float(self.v[-1]) if len(self.v) else None

    @property
    def range(self) -> float | None:
        return None if not len(self.v) else float(self.v.max() - self.v.min())

    @_memo
    def _sorted(self) -> np.ndarray:
        return np.sort(self.v)

    def quantile(self, q: float) -> float | None:
        """Linear-interpolated quantile (numpy's default method), without np.quantile's overhead."""
        n = len(self.v)
        if not n:
            return None
        srt = self._sorted
        pos = q * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        return float(srt[lo] + (srt[hi] - srt[lo]) * (pos - lo))

    def below_max(self, q: float) -> float | None:
        """How far (in the signal's units) the ``q`` quantile sits under the span's maximum: the
        depth of the dips below a ceiling (a cap read less the requests just finished)."""
        top, at = self.max, self.quantile(q)
        return None if top is None or at is None else top - at

    def frac_above(self, x: float) -> float | None:
        """Fraction of samples ≥ x."""
        return np.count_nonzero(self.v >= x) / len(self.v) if len(self.v) else None

    def frac_below(self, x: float) -> float | None:
        """Fraction of samples ≤ x."""
        return np.count_nonzero(self.v <= x) / len(self.v) if len(self.v) else None

    def frac_near_max(self, tol: float = 0.05, floor: float = 1.0) -> float | None:
        """Fraction of samples within ``tol`` (relative, but at least ``floor`` units) of the
        span's maximum: 'pinned at a ceiling'. The 1-unit floor keeps a small request cap (8)
        pinned when a scrape lands between one request finishing and the next admitted; a
        half-unit floor (``frac_at_max``) counts a small count's own maximum only."""
        if not len(self.v):
            return None
        top = float(self.v.max())
        if top <= 0:
            return 0.0
        return np.count_nonzero(self.v >= top - max(top * tol, floor)) / len(self.v)

    @property
    def last_above(self) -> float | None:
        """Fraction of the span's other samples strictly below the last one (1.0: the last
        sample is a new high, e.g. running right after a raised cap or a restart admitted the
        queue; a series pinned at its ceiling scores ~0 through the ties). None with < 2."""
        n = len(self.v)
        if n < 2:
            return None
        return float(np.count_nonzero(self.v[:-1] < self.v[-1])) / (n - 1)

    def pinned_tail(self, tol: float = 0.02) -> float | None:
        """Share of the span, counted back from its end, during which the signal sat at one
        ceiling: the longest suffix whose samples all lie within ``tol`` (relative, but at
        least 1 unit, as :meth:`frac_near_max`) of that suffix's maximum. A cap changed inside
        the span (max_num_seqs cut) starts a new ceiling, which ``frac_near_max`` over the
        whole span misses; 0.0 when the last value is ≤ 0 (nothing running is no ceiling), and
        when the samples before the suffix sat at its level too (their median within twice the
        band of the suffix's): a series wandering around one level changed no ceiling, and
        ``frac_near_max`` says whether that level is one."""
        n = len(self.v)
        if not n:
            return None
        vals = self.v.tolist()
        hi = lo = vals[-1]
        if hi <= 0:
            return 0.0
        k = 0
        for x in reversed(vals):
            hi, lo = max(hi, x), min(lo, x)
            if hi - lo > max(hi * tol, 1.0):
                break
            k += 1
        if k < n:
            before, tail = np.median(self.v[: n - k]), np.median(self.v[n - k:])
            if abs(float(before) - float(tail)) <= 2 * max(hi * tol, 1.0):
                return 0.0
        return k / n

    @_memo
    def slope(self) -> float | None:
        """Least-squares trend in units per minute (None with < MIN_SAMPLES samples)."""
        if len(self.v) < MIN_SAMPLES:
            return None
        return _ls_slope(self.ts / 60.0, self.v)

    def cycles(self, high: float, low: float, dwell: int = 1, open_end: bool = False) -> int | None:
        """Completed excursions: ≥ ``dwell`` consecutive samples ≥ high, then a sample ≤ low.

        Hysteresis between ``low`` and ``high`` ignores wiggles in the middle band;
        ``dwell`` > 1 ignores one-sample spikes (a scrape caught mid-burst).
        ``open_end`` also counts an excursion still under way at the end of the span (held
        ``dwell`` samples, not drained yet): "episodes" rather than completed cycles, so a
        fill, a drain and a second fill count 2 while the second peak lasts.
        """
        if not len(self.v):
            return None
        n, run, armed = 0, 0, False
        for x in self.v.tolist():
            if x >= high:
                run += 1
                armed = armed or run >= dwell
            else:
                run = 0
                if x <= low and armed:
                    n += 1
                    armed = False
        return n + (1 if open_end and armed else 0)

    def since_above(self, x: float) -> float | None:
        """Seconds from the last sample ≥ ``x`` to the span's end (0.0 when the last sample,
        at the end, is ≥ ``x``); None when no sample reaches ``x`` or the span is empty."""
        return self._since_last(self.v >= x)

    def since_near_peak(self, share: float) -> float | None:
        """:meth:`since_above` of ``share`` × the span's maximum: how long ago the signal was
        last at its own scale (one request caught waiting where peaks queued 30 is not a peak).
        None when the span is empty or never rises above 0."""
        if not len(self.v):
            return None
        top = float(self.v.max())
        return self._since_last(self.v >= share * top) if top > 0 else None

    def since_below(self, x: float) -> float | None:
        """Seconds from the last sample ≤ ``x`` to the span's end (0.0 when the last sample,
        at the end, is ≤ ``x``): how long a queue has been up without a break. None when no sample
        is ≤ ``x`` (up all span: longer than it shows) or the span is empty."""
        return self._since_last(self.v <= x)

    def _since_last(self, hit: np.ndarray) -> float | None:
        """Seconds from the last sample where ``hit`` holds to the span's end (its last instant,
        a sample or not)."""
        idx = np.flatnonzero(hit)
        return float(self.end - self.ts[idx[-1]]) if len(idx) else None

    def _rises(self, x: float) -> list[tuple[float, float]]:
        """(time, quiet s) of every rise to ≥ ``x`` after the signal sat at ≤ ``x``/2 (the
        hysteresis of :meth:`cycles`: values in between neither end nor start the quiet), the
        quiet counted from its first sample to the sample that rises. The excursion under way
        when the span opens has no rise."""
        rises: list[tuple[float, float]] = []
        quiet_from: float | None = None
        for t, v in zip(self.ts.tolist(), self.v.tolist(), strict=True):
            if v <= x / 2:
                quiet_from = t if quiet_from is None else quiet_from
            elif v >= x:
                if quiet_from is not None:
                    rises.append((t, t - quiet_from))
                quiet_from = None
        return rises

    def _held_starts(self, x: float, min_gap_s: float) -> list[float]:
        """Times of the rises to ≥ ``x`` (:meth:`_rises`) after at least ``min_gap_s`` seconds quiet."""
        return [t for t, quiet in self._rises(x) if quiet >= min_gap_s]

    def quiet_before_last(self, x: float) -> float | None:
        """Seconds the signal sat at ≤ ``x``/2 before its latest rise to ≥ ``x`` (:meth:`_rises`):
        the trough behind the newest peak. None when no rise follows a quiet stretch in the span
        (nothing reaches ``x``, or it is up since the span opened)."""
        rises = self._rises(x)
        return rises[-1][1] if rises else None

    def held_drains(self, x: float, min_gap_s: float = 60.0) -> int | None:
        """Drains between excursions: stretches at ≤ ``x``/2 held at least ``min_gap_s`` seconds
        and followed by a new rise to ≥ ``x``. A queue that empties for a scrape now and then
        while a cap binds all along scores 0 (at 60 s scrapes one empty scrape spans 60 s
        of the grid and counts). None for an empty span."""
        if not len(self.v):
            return None
        return len(self._held_starts(x, min_gap_s))

    def quiet_spacings(self, x: float, min_gap_s: float = 60.0) -> float | None:
        """:meth:`since_above` in units of the series' own cycle: the median spacing (s)
        between the starts of its episodes at ≥ ``x`` (:meth:`_held_starts`: a queue drained
        for one 30 s scrape in the middle of a peak is the same episode, not a cycle of 60 s).
        A long cycle in its trough scores < 1, a cycle that stopped scores more the longer it
        stays quiet. None with fewer than two starts (no spacing to measure) or when nothing
        reaches ``x``."""
        since = self.since_above(x)
        if since is None:
            return None
        starts = self._held_starts(x, min_gap_s)
        if len(starts) < 2:
            return None
        spacing = float(np.median(np.diff(starts)))
        return since / spacing if spacing > 0 else None

    def spacing_cv(self, x: float, min_gap_s: float = 60.0) -> float | None:
        """How regular the episodes at ≥ ``x`` recur: the coefficient of variation (std / mean)
        of the spacings between their starts (:meth:`_held_starts`). A cycle scores near 0,
        bursts at random near 1 (exponential gaps). None with fewer than three starts (two
        spacings are the least a spread can be read from)."""
        gaps = np.diff(self._held_starts(x, min_gap_s))
        if len(gaps) < 2 or gaps.mean() <= 0:
            return None
        return float(gaps.std() / gaps.mean())

    def swings(self, min_range: float = 0.3, dwell: int = 1, open_end: bool = False) -> int | None:
        """Completed fill/drain excursions relative to the span's own range.

        An excursion rises into the top 30 % of [min, max] and drains back into the
        bottom 30 %. Spans whose range is below ``min_range`` have no swings, so
        sensor noise on a flat pool never counts.
        """
        if not len(self.v):
            return None
        lo, hi = float(self.v.min()), float(self.v.max())
        span = hi - lo
        if span < min_range:
            return 0
        return self.cycles(hi - 0.3 * span, lo + 0.3 * span, dwell, open_end)

    def fill_drain(self, share: float = 0.5, open_end: bool = False) -> int | None:
        """Completed fill-and-drain excursions relative to the span's own peak.

        Like :meth:`swings` (top 30 % of [min, max], then bottom 30 %), but the range
        must be at least ``share`` of the maximum instead of an absolute amount, so a
        batch of 32 requests that drains to 8 counts whatever its unit or scale.
        """
        if not len(self.v):
            return None
        lo, hi = float(self.v.min()), float(self.v.max())
        span = hi - lo
        if hi <= 0 or span < share * hi:
            return 0
        return self.cycles(hi - 0.3 * span, lo + 0.3 * span, open_end=open_end)

    @_memo
    def _periodogram(self) -> tuple[float, float] | None:
        """(dominant period in seconds, share of spectral power at that peak)."""
        from scipy.fft import rfft, rfftfreq

        if len(self.v) < 2 * MIN_SAMPLES or np.ptp(self.ts) <= 0:
            return None
        # resample onto a regular grid: scrape gaps would otherwise bend the spectrum
        dt = float(np.median(np.diff(self.ts)))
        if dt <= 0:
            return None
        if len(self.ts) == round((self.ts[-1] - self.ts[0]) / dt) + 1:
            grid, y = self.ts, self.v  # already regular: no resampling needed
        else:
            grid = np.arange(self.ts[0], self.ts[-1] + dt / 2, dt)
            y = np.interp(grid, self.ts, self.v)
        y = y - y.mean()
        if not np.any(y):
            return None
        # the periodogram itself (|FFT|² of the linearly detrended series): scipy.signal's
        # periodogram computes the same through its STFT machinery at ~100x the cost
        power = np.abs(rfft(y - _ls_line(grid, y))) ** 2
        freqs = rfftfreq(len(y), d=dt)
        freqs, power = freqs[1:], power[1:]
        total = float(power.sum())
        if total <= 0 or not len(power):
            return None
        i = int(np.argmax(power))
        # the peak's share includes its direct neighbours: leakage of a period that
        # does not divide the span spreads over adjacent bins
        share = float(power[max(0, i - 1) : i + 2].sum()) / total
        return 1.0 / float(freqs[i]), share

    @property
    def period(self) -> float | None:
        p = self._periodogram
        return None if p is None else p[0]

    @property
    def periodicity(self) -> float | None:
        p = self._periodogram
        return None if p is None else p[1]


def _ls_slope(t: np.ndarray, y: np.ndarray) -> float | None:
    """Least-squares slope of y over t in closed form (cov/var): no lstsq for two parameters."""
    tc = t - t.mean()
    var = float(tc @ tc)
    return None if var <= 0 else float(tc @ (y - y.mean())) / var


def _ls_line(t: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The least-squares line through (t, y): what a linear detrend subtracts."""
    slope = _ls_slope(t, y) or 0.0
    return y.mean() + slope * (t - t.mean())


def safe_ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is not positive."""
    if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or b <= 0:
        return None
    return a / b
