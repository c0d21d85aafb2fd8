"""The simulated SGLang counts tokens the way SGLang does: when a request finishes.

SGLang's tokenizer manager adds a request's prompt and generated tokens to
``sglang:prompt_tokens_total`` / ``sglang:generation_tokens_total`` in
``TokenizerMetricsCollector.observe_one_finished_request`` (sgl-project/sglang
python/sglang/srt/metrics/collector.py), together with ``num_requests_total``: between two
scrapes in which no request finished, neither token counter moves, however much the engine
decoded. A simulator that counts per step hides what real SGLang shows (a zero token rate
while long generations decode), so kvwatch's stall rules were only ever tried on the
friendlier counter.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from kvwatch.sim.corpus import default_end_time
from kvwatch.sim.fleet import make_targets, simulate
from kvwatch.sim.openmetrics import write_openmetrics


def _series(text: str, name: str) -> np.ndarray:
    """Values of the one series ``name`` in scrape order (an OpenMetrics backfill file)."""
    pat = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+) (\S+)$", re.M)
    rows = sorted((float(ts), float(v)) for v, ts in pat.findall(text))
    return np.array([v for _, v in rows])


def test_sglang_token_counters_move_only_when_requests_finish(tmp_path: Path) -> None:
    (spec,) = make_targets("idle-low-demand", "sglang-0.5", seed=3, run_s=900.0)
    om = tmp_path / "sglang.om"
    write_openmetrics([simulate(spec, duration_s=600.0, end_time=default_end_time(lag_s=3600),
                                warmup_s=120.0, scrape_interval_s=5.0)], om)
    text = om.read_text()
    finished = np.diff(_series(text, "sglang:num_requests_total"))
    gen = np.diff(_series(text, "sglang:generation_tokens_total"))
    prompt = np.diff(_series(text, "sglang:prompt_tokens_total"))
    assert len(finished) == len(gen) == len(prompt) > 100
    assert (finished > 0).any() and (finished == 0).any(), "a nearly idle pool has scrapes with and without finishes"
    assert not gen[finished == 0].any() and not prompt[finished == 0].any(), "tokens counted without a finish"
    assert (gen[finished > 0] > 0).all(), "a finish adds its generated tokens"
