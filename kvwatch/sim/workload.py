"""Request workload: arrival-rate shapes (req/s) and prompt/output length distributions (tokens)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numpy as np

_Z99 = 2.3263478740408408  # standard normal 99th percentile


@dataclass(frozen=True)
class Steady:
    """Constant Poisson rate, requests per second."""

    rate: float

    def __call__(self, t: float) -> float:
        return self.rate


@dataclass(frozen=True)
class Periodic:
    """Square or sine wave between ``low`` and ``high`` req/s; ``period_s``, ``duty`` in (0, 1)."""

    low: float
    high: float
    period_s: float
    duty: float = 0.5
    wave: Literal["square", "sine"] = "square"
    phase_s: float = 0.0

    def __call__(self, t: float) -> float:
        x = ((t + self.phase_s) % self.period_s) / self.period_s
        if self.wave == "square":
            return self.high if x < self.duty else self.low
        return self.low + (self.high - self.low) * 0.5 * (1.0 + math.sin(2 * math.pi * x))


@dataclass(frozen=True)
class Bursty:
    """Random on/off bursts: ``base`` req/s, ``peak`` during bursts; exponential durations, s."""

    base: float
    peak: float
    mean_on_s: float
    mean_off_s: float
    seed: int = 0
    horizon_s: float = 86_400.0

    @cached_property
    def _toggles(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        n = int(self.horizon_s / max(self.mean_on_s + self.mean_off_s, 1.0)) * 2 + 4
        means = np.tile([self.mean_off_s, self.mean_on_s], n // 2)
        return np.cumsum(rng.exponential(means))

    def __call__(self, t: float) -> float:
        k = int(np.searchsorted(self._toggles, t, side="right"))
        return self.peak if k % 2 else self.base


@dataclass(frozen=True)
class Piecewise:
    """Phases ``((end_s, shape), ...)``: each shape applies until its end (relative time, s)."""

    phases: tuple[tuple[float, RateShape], ...]

    def __call__(self, t: float) -> float:
        start = 0.0
        for end, shape in self.phases:
            if t < end:
                return shape(t - start)
            start = end
        return self.phases[-1][1](t - start) if self.phases else 0.0


RateShape = Steady | Periodic | Bursty | Piecewise


@dataclass(frozen=True)
class LogNormal:
    """Lognormal-ish length distribution given its median and 99th percentile (tokens)."""

    median: float
    p99: float

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        sigma = math.log(max(self.p99, self.median * 1.0001) / self.median) / _Z99
        return rng.lognormal(math.log(self.median), sigma, n)


@dataclass(frozen=True)
class Mixture:
    """Mix of length distributions, e.g. 95 % short chat + 5 % long-context prompts."""

    parts: tuple[tuple[float, LengthDist], ...]  # (weight, distribution)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        w = np.array([p for p, _ in self.parts], dtype=float)
        which = rng.choice(len(self.parts), size=n, p=w / w.sum())
        out = np.empty(n)
        for i, (_, dist) in enumerate(self.parts):
            sel = which == i
            if sel.any():
                out[sel] = dist.sample(rng, int(sel.sum()))
        return out


@dataclass(frozen=True)
class Uniform:
    """Uniform length between ``low`` and ``high`` tokens."""

    low: float
    high: float

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.uniform(self.low, self.high, n)


LengthDist = LogNormal | Mixture | Uniform


@dataclass(frozen=True)
class Workload:
    """What clients send: arrival shape, prompt/output lengths, ``max_tokens``, prefix reuse."""

    rate: RateShape
    prompt: LengthDist = field(default_factory=lambda: LogNormal(800, 6000))
    output: LengthDist = field(default_factory=lambda: LogNormal(200, 1200))
    max_tokens: int = 2048
    prefix_hit_frac: float = 0.2  # fraction of prompt tokens served by the prefix cache

    def lengths(self, rng: np.random.Generator, n: int, max_model_len: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample (prompt, output, max_tokens) arrays for ``n`` requests, tokens.

        Output is capped by ``max_tokens`` and the context by ``max_model_len``.
        """
        prompt = np.clip(np.rint(self.prompt.sample(rng, n)), 1, max_model_len - 1)
        max_tok = np.minimum(self.max_tokens, max_model_len - prompt)
        out = np.clip(np.rint(self.output.sample(rng, n)), 1, max_tok)
        return prompt, out, max_tok

    def means(self, max_model_len: int, n: int = 20_000, seed: int = 12345
              ) -> tuple[np.ndarray, np.ndarray]:
        """A fixed sample of (prompt, output) used for capacity calibration."""
        prompt, out, _ = self.lengths(np.random.default_rng(seed), n, max_model_len)
        return prompt, out
