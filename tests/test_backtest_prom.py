"""Acceptance: a known phase schedule backfilled into a real Prometheus, replayed by ``kvwatch backtest``.

pod-0 runs healthy-busy → full (30 min) → healthy-busy; pod-1 stays healthy-busy.
The replayed timeline must follow the phases outside the transition zones that
the rules' ``for`` spans and the rate window explain, the incident must fire
after the lifecycle's ``for`` and resolve after the hold-down, the last step
must equal ``kvwatch once --at T1``, and the number of queries must not depend
on the number of steps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
from support.prom import backfill, prometheus

from kvwatch.cli import main
from kvwatch.config import load_settings
from kvwatch.core.churn import leftover_queries
from kvwatch.core.collect import bucket_query, plan, quantile_families
from kvwatch.core.dialects import SourceKind
from kvwatch.core.discover import discover
from kvwatch.core.models import FailureMode
from kvwatch.core.promclient import PromClient
from kvwatch.core.rules import load_ruleset
from kvwatch.core.scrape import interval_queries
from kvwatch.tools.backtest.replay import run_backtest
from kvwatch.tools.backtest.synth import SynthTarget, write_openmetrics

D0 = 1_780_000_000 - 1_780_000_000 % 3600  # data start, hour aligned, in the past
MIN = 60.0
FULL_START, FULL_END = D0 + 45 * MIN, D0 + 75 * MIN
T0, T1 = D0 + 30 * MIN, D0 + 105 * MIN  # T0 leaves a full 30 min window of history
TARGETS = (
    SynthTarget("pod-0:8000", ((45 * MIN, "healthy-busy"), (30 * MIN, "full"), (30 * MIN, "healthy-busy")), seed=1),
    SynthTarget("pod-1:8000", ((105 * MIN, "healthy-busy"),), seed=2),
)
#: rule `for` (10m) + rate window (2m) + one step: how long a phase change may take to show
ZONE = 10 * MIN + 2 * MIN + 30.0


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("bt")
    om = write_openmetrics(work / "phases.om", TARGETS, D0, D0 + 105 * MIN)
    backfill(Path(om), work / "tsdb")
    with prometheus(tsdb=work / "tsdb") as url:
        yield url


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def _cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_timeline_follows_phases_and_incident_lifecycle(prom_url: str) -> None:
    settings = load_settings(None, environ={}, overrides={"prometheus": {"url": prom_url}})
    client = PromClient(prom_url)
    res = run_backtest(client, settings, load_ruleset(), datetime.fromtimestamp(T0, UTC), datetime.fromtimestamp(T1, UTC))
    assert res.steps[0] == T0 and res.steps[-1] == T1 and len(res.steps) == 151
    sick, well = res.timeline("pod-0:8000"), res.timeline("pod-1:8000")
    assert sick is not None and well is not None
    assert set(well.states) == {FailureMode.HEALTHY} and not well.incidents
    checked = 0
    for t, state in zip(sick.times, sick.states, strict=True):
        expected = FailureMode.FULL if FULL_START <= t < FULL_END else FailureMode.HEALTHY
        in_zone = any(b <= t < b + ZONE for b in (FULL_START, FULL_END))
        # at the onset, a queue that persists before the full rule's `for` has elapsed is
        # `unknown` (a persistent queue is never healthy); outside the transitions, never
        assert state is not FailureMode.UNKNOWN or in_zone, _iso(t)
        if not in_zone:
            assert state is expected, f"{_iso(t)}: {state} != {expected}"
            checked += 1
    assert checked > 100
    full_steps = [t for t, s in zip(sick.times, sick.states, strict=True) if s is FailureMode.FULL]
    assert FULL_START < full_steps[0] <= FULL_START + 10 * MIN + 30
    assert FULL_END <= full_steps[-1] + 30 <= FULL_END + 2 * MIN + 60
    [inc] = [i for i in sick.incidents if i.mode is FailureMode.FULL]
    assert inc.rule == "full-kv-pressure" and inc.severity.value == "critical"
    assert inc.pending_at == full_steps[0]
    # the rule's `for` is enforced inside the diagnosis (its statistic spans the last `for`),
    # the lifecycle adds only pending_for
    assert inc.opened_at - inc.pending_at == pytest.approx(settings.lifecycle.pending_for)
    # resolves once clear for the hold-down, counted from the last step it was seen
    assert inc.resolved_at is not None
    assert inc.resolved_at - full_steps[-1] == pytest.approx(settings.lifecycle.hold_down, abs=30)
    # anything else that fired is a transitional state inside a phase-change zone
    for other in sick.incidents:
        if other is not inc:
            assert any(b <= other.opened_at < b + ZONE for b in (FULL_START, FULL_END)), other


def test_queries_do_not_depend_on_steps(prom_url: str) -> None:
    settings = load_settings(None, environ={}, overrides={"prometheus": {"url": prom_url}})
    rules = load_ruleset()
    counts = []
    for step in (30.0, 300.0):
        client = PromClient(prom_url)
        res = run_backtest(client, settings, rules, datetime.fromtimestamp(T0, UTC), datetime.fromtimestamp(T1, UTC), step)
        counts.append((client.stats.queries, res.queries, len(res.steps)))
    at = datetime.fromtimestamp(T1, UTC)
    targets = discover(PromClient(prom_url), at, 1800.0, "")
    queries = plan(targets, "", "2m")
    # one instant query per histogram family for its top finite bucket (quantiles past it are bounds)
    n_buckets = len({bucket_query(src, "") for uses in queries.values() for _, _, src in uses
                     if src.kind is SourceKind.HIST_QUANTILE})
    # the quantiles of one histogram family (TTFT p50 and p99), fetched alike, are one bucket query
    families = quantile_families(queries, dict.fromkeys(queries, "range"), "", "2m")
    merged = sum(len(qs) - 1 for qs in families.values())
    assert merged >= 1
    assert [c[2] for c in counts] == [151, 16]
    # relabel-leftover probes: one per KV family (kvwatch/core/churn.py), once for the whole span
    probes = len(leftover_queries(targets, "", 60.0))
    assert probes >= 1
    # the scrape-interval probe (raw KV samples, one per KV family) sizes the rate windows once
    intervals = len(interval_queries(targets, ""))
    assert intervals >= 1
    # two discovery queries + one per (signal, source), less the merged quantiles, + the bucket bounds
    assert counts[0][0] == counts[1][0] == counts[0][1] == 2 + len(queries) - merged + n_buckets + probes + intervals


def test_last_step_equals_once_and_cli_outputs(prom_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    labels = tmp_path / "labels.yaml"
    labels.write_text(
        "grace: 15m\ntargets:\n  pod-0:8000:\n"
        f"    - {{from: {_iso(FULL_START)}, to: {_iso(FULL_END)}, mode: full}}\n  pod-1:8000: []\n"
    )
    html = tmp_path / "report.html"
    for t1 in (T1, FULL_START + 20 * MIN):  # after recovery, and in the middle of the full phase
        bt = _cli_json(
            capsys, "backtest", "--prometheus-url", prom_url, "--from", _iso(T0), "--to", _iso(t1),
            "--step", "1m", "--format", "json", "--labels", str(labels), "--html", str(html),
        )
        once = _cli_json(capsys, "once", "--prometheus-url", prom_url, "--at", _iso(t1), "--format", "json")
        want = {t["labels"]["instance"]: t["state"] for t in once["targets"]}
        got = {t["labels"]["instance"]: t["timeline"][-1]["state"] for t in bt["targets"]}
        assert got == want and len(got) == 2
        assert {t["labels"]["instance"]: t["last_state"] for t in bt["targets"]} == want
    assert want["pod-0:8000"] == "full"  # the mid-phase run really is in the full state
    assert bt["to"] == _iso(FULL_START + 20 * MIN) and bt["step"] == 60.0
    # scores of the first (full-span) run: printed by the CLI from the same incidents
    full = _cli_json(capsys, "backtest", "--prometheus-url", prom_url, "--from", _iso(T0), "--to", _iso(T1),
                     "--format", "json", "--labels", str(labels))
    incs = next(t for t in full["targets"] if t["labels"]["instance"] == "pod-0:8000")["incidents"]
    [inc] = [i for i in incs if i["mode"] == "full"]
    s = full["scores"]["modes"]["full"]
    assert s["incidents"] == {"expected": 1, "detected": 1, "raised": 1, "true": 1, "precision": 1.0, "recall": 1.0}
    opened = datetime.fromisoformat(inc["opened_at"].replace("Z", "+00:00")).timestamp()
    resolved = datetime.fromisoformat(inc["resolved_at"].replace("Z", "+00:00")).timestamp()
    assert s["detection_s"]["values"] == [opened - FULL_START]
    assert s["reset_s"]["values"] == [resolved - FULL_END]
    # step-wise: recount from the change points; detection lag costs recall, the clearing lag precision
    tl = next(t for t in full["targets"] if t["labels"]["instance"] == "pod-0:8000")["timeline"]
    ts = [datetime.fromisoformat(e["at"].replace("Z", "+00:00")).timestamp() for e in tl] + [T1 + 30]
    full_steps = [x for i, e in enumerate(tl) if e["state"] == "full" for x in range(int(ts[i]), int(ts[i + 1]), 30)]
    tp = sum(FULL_START <= x < FULL_END for x in full_steps)
    assert (s["steps"]["tp"], s["steps"]["fp"]) == (tp, len(full_steps) - tp)
    assert s["steps"]["fn"] == int((FULL_END - FULL_START) // 30) - tp
    assert 0.5 < s["steps"]["recall"] < 1.0 and 0.8 < s["steps"]["precision"] < 1.0
    page = html.read_text()
    assert page.count("data:image/png;base64,") == 2 and "full-kv-pressure" in page


def test_bad_step_is_a_usage_error(prom_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["backtest", "--prometheus-url", prom_url, "--from", _iso(T0), "--to", _iso(T1), "--step", "45s"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "multiple of the data resolution" in err and "--resolution" in err, err


#: state band colours blended at the chart's alpha (0.18) over white, as a browser shows them
_BAND_RGB = {"full": (248, 216, 216), "healthy": (217, 238, 217)}


def _band_pixels(png: Path, rgb: tuple[int, int, int], tol: int = 6) -> int:
    from PIL import Image

    img = Image.open(png).convert("RGB")
    return sum(
        n for n, px in (img.getcolors(maxcolors=1 << 24) or [])
        if all(abs(a - b) <= tol for a, b in zip(px, rgb, strict=True))
    )


def test_html_report_renders_in_a_browser(prom_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Open the report the way a user does (headless Chromium) and look at the pixels:
    the embedded charts decode and show the full phase as a red band next to green healthy bands."""
    import subprocess

    from support.prom import require_binary

    chromium = require_binary("chromium", "chromium-browser")
    labels = tmp_path / "labels.yaml"
    labels.write_text(f"targets:\n  pod-0:8000:\n    - {{from: {_iso(FULL_START)}, to: {_iso(FULL_END)}, mode: full}}\n")
    html = tmp_path / "report.html"
    _cli_json(capsys, "backtest", "--prometheus-url", prom_url, "--from", _iso(T0), "--to", _iso(T1),
              "--format", "json", "--labels", str(labels), "--html", str(html))
    shot = tmp_path / "report.png"
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}"]
    subprocess.run([*base, "--window-size=1000,1400", f"--screenshot={shot}", html.as_uri()],
                   check=True, capture_output=True, timeout=120)
    dom = subprocess.run([*base, "--dump-dom", html.as_uri()], check=True, capture_output=True,
                         timeout=120, text=True).stdout
    assert "<h1>kvwatch backtest</h1>" in dom and dom.count("data:image/png;base64,") == 2
    # the first chart is pod-0 (it has the incident): its full band and healthy bands are visible
    assert _band_pixels(shot, _BAND_RGB["full"]) > 2000
    assert _band_pixels(shot, _BAND_RGB["healthy"]) > 2000


def test_samples_export_is_the_history_prometheus_holds(
    prom_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``--samples`` writes the replayed history as a tidy CSV (built with prometheus-api-client's
    MetricRangeDataFrame); its KV values are what Prometheus answers for the raw metric."""
    out = tmp_path / "samples.csv"
    t0, t1 = FULL_START, FULL_START + 20 * MIN
    _cli_json(capsys, "backtest", "--prometheus-url", prom_url, "--from", _iso(t0), "--to", _iso(t1),
              "--step", "5m", "--format", "json", "--samples", str(out))
    frame = pd.read_csv(out)
    assert list(frame.columns) == ["job", "instance", "signal", "ts", "value"]
    kv = frame[frame["signal"] == "kv_usage"]
    assert set(kv["instance"]) == {"pod-0:8000", "pod-1:8000"}
    ts = pd.to_datetime(kv["ts"], utc=True).map(lambda x: x.timestamp())
    assert ts.min() >= t0 - 30 * MIN and ts.max() == t1  # the window before T0 through T1
    client = PromClient(prom_url)
    for inst in ("pod-0:8000", "pod-1:8000"):
        rows = kv[kv["instance"] == inst]
        assert len(rows) > 50  # 30 s data resolution over 50 min, not one row per step
        at = float(ts[rows.index[-1]])
        [raw] = client.instant(f'vllm:kv_cache_usage_perc{{instance="{inst}"}}', datetime.fromtimestamp(at, tz=UTC))
        assert rows["value"].iloc[-1] == pytest.approx(float(raw["value"][1]))
    # pod-0 is in its full phase at the end, pod-1 stays healthy-busy
    last = kv.groupby("instance")["value"].last()
    assert last["pod-0:8000"] > last["pod-1:8000"]
