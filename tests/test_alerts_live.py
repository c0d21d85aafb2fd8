"""Issue 17 acceptance on the live simulator, a real Prometheus and `kvwatch run` (fake Slack).

One simulator (two ``full`` and two ``healthy-busy`` targets, 30x clock) and one Prometheus
scraping every second through ``file_sd`` files the tests rewrite, shared by:

* rollout: job ``llm/rollout`` (a Prometheus-Operator style ``namespace/name``). A fresh
  Prometheus: nothing fires before the rule's ``for`` (20 s) is covered by samples. kvwatch is
  restarted mid-incident: no second parent. Then the Deployment rolls: the old pod leaves
  discovery, a new one appears: nobody is paged, the old incident resolves quietly as *gone*.
* modes: one engine goes full → oscillating → healthy: one Slack thread for the episode, the
  mode change a reply in it, the parent updated in place.

Durations are wall seconds (Prometheus stamps samples with its own clock); see
``tests/fixtures/alerts/rules.yaml``.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from support.fake_slack import FakeSlack, fake_slack
from support.polling import wait
from support.prom import kvwatch_port, prometheus, require_binary
from test_service_e2e import TOKEN, clean_env, spawn

pytestmark = [pytest.mark.prometheus, pytest.mark.slow, pytest.mark.live]

RULES = Path(__file__).parent / "fixtures" / "alerts" / "rules.yaml"
FOR_S = 20.0
ROLLOUT_JOB = "llm/rollout"
MODES_JOB = "kvwatch-modes"
DEADLINE_JOB = "kvwatch-deadline"


@dataclass
class Live:
    slack: FakeSlack
    sim_url: str
    host: str
    prom: str
    tmp: Path
    targets: dict[str, list[str]]  # preset → target names
    started: float  # wall time when Prometheus started scraping

    def sd(self, name: str, targets: list[str]) -> None:
        """Point the file_sd file ``name`` at ``targets`` (atomically: Prometheus watches the file)."""
        doc = [{"targets": [self.host], "labels": {"__metrics_path__": f"/targets/{t}/metrics", "instance": t}}
               for t in targets]
        tmp = self.tmp / f".{name}.json"
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.tmp / f"{name}.json")

    def query(self, q: str) -> list[dict[str, Any]]:
        return requests.get(f"{self.prom}/api/v1/query", params={"query": q}, timeout=5).json()["data"]["result"]

    def kvwatch(self, stack: ExitStack, job: str, channel: str, state: Path, log: str, prom: str = "",
                listen: str = "127.0.0.1:0", **lifecycle: str) -> Any:
        cfg = self.tmp / f"{log}.yaml"
        life = ", ".join(f"{k}: {v}" for k, v in {"pending_for": "0s", "hold_down": "8s", "reminder_interval": "0s",
                                                   "blind_spot_for": "24s", "forget_after": "0s", **lifecycle}.items())
        cfg.write_text(
            "prometheus: {timeout: 5s, retries: 0}\n"
            "evaluation: {interval: 2s, window: 60s, step: 2s, rate_window: 6s}\n"
            f"lifecycle: {{{life}}}\n"
            f"discovery: {{selector: '{{job=\"{job}\"}}'}}\n"
            "slack: {charts: false, timeout: 5s}\n")
        env = clean_env(SLACK_BOT_TOKEN=TOKEN, SLACK_CHANNEL=channel, KVWATCH_SLACK_API_URL=self.slack.api_url)
        return stack.enter_context(spawn(
            log, ["run", "--config", str(cfg), "--rules", str(RULES), "--prometheus-url", prom or self.prom,
                  "--state", str(state), "--listen", listen], self.tmp / f"{log}.log", env))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    require_binary("prometheus")
    tmp = tmp_path_factory.mktemp("alerts-live")
    with ExitStack() as stack:
        slack = stack.enter_context(fake_slack())
        sim = stack.enter_context(spawn(
            "simulator", ["simulate", "serve", "--host", "127.0.0.1", "--port", "0", "--presets", "full,healthy-busy",
                          "--dialects", "vllm-0.33", "--seeds", "2", "--speed", "30"], tmp / "sim.log", clean_env()))
        url = wait("the simulator's URL", lambda: (m := re.search(r"on (http://127\.0\.0\.1:\d+)", sim.text()))
                   and m.group(1), 30)
        targets: dict[str, list[str]] = {}
        for t in requests.get(f"{url}/targets", timeout=10).json():
            targets.setdefault(t["preset"], []).append(t["name"])
        live = Live(slack, url, url.removeprefix("http://"), "", tmp, targets, 0.0)
        live.sd("rollout", [targets["full"][0]])
        live.sd("modes", [targets["healthy-busy"][1]])
        live.sd("deadline", [targets["full"][1]])
        cfg = ("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
               + "".join(f"  - job_name: {job}\n    file_sd_configs:\n      - files: ['{tmp / name}.json']\n"
                         f"        refresh_interval: 1s\n"
                         for job, name in ((ROLLOUT_JOB, "rollout"), (MODES_JOB, "modes"),
                                           (DEADLINE_JOB, "deadline"))))
        live.prom = stack.enter_context(prometheus(config=cfg))
        live.started = time.time()
        yield live


def parents(live: Live, channel: str) -> list[tuple[str, str]]:
    return live.slack.parents(channel)


def replies(live: Live, channel: str, ts: str) -> list[dict[str, Any]]:
    return [c.body for c in live.slack.of("chat.postMessage") if c.body.get("channel") == channel
            and c.body.get("thread_ts") == ts]


def test_rollout_pages_nobody_and_resolves_the_old_incident_as_gone(live: Live) -> None:
    channel = "#rollout"
    old, new = live.targets["full"][0], live.targets["healthy-busy"][0]
    with ExitStack() as stack:
        run = live.kvwatch(stack, ROLLOUT_JOB, channel, live.tmp / "rollout-state.json", "kvwatch-rollout-1")
        (parent,) = wait("the full incident's parent", lambda: parents(live, channel), 90,
                         lambda: run.text()[-3000:])
        fired_wall = time.time()
        first = live.query(f'min_over_time(timestamp(up{{job="{ROLLOUT_JOB}",instance="{old}"}})[3m:1s])')
        first_sample = float(first[0]["value"][1])
        # fresh Prometheus: the rule's `for` (20 s) must be covered by samples before anything fires
        # (allowance: two 2 s evaluation steps: the data grid and the first sample's step)
        print(f"rollout: first sample → fire {fired_wall - first_sample:.1f}s (for {FOR_S:g}s)")
        assert fired_wall - first_sample >= FOR_S - 4.0, run.text()[-3000:]

        # restart mid-incident: identity with job="llm/rollout" survives, no second parent
        run.popen.send_signal(signal.SIGTERM)
        assert run.popen.wait(timeout=15) == 0
        run2 = live.kvwatch(stack, ROLLOUT_JOB, channel, live.tmp / "rollout-state.json", "kvwatch-rollout-2")
        wait("three cycles after the restart", lambda: run2.text().count("kvwatch cycle ") >= 3, 60)
        assert parents(live, channel) == [parent], "a second parent after a restart (job with '/')"
        assert replies(live, channel, parent[1]) == []

        # the rollout: the old pod leaves discovery, the new one appears
        live.sd("rollout", [new])
        t_roll = time.monotonic()

        def resolved_gone() -> bool:
            text = json.dumps(live.slack.messages[parent].get("blocks"))
            return "RESOLVED" in text and "gone" in text

        wait("the old incident resolved as gone", resolved_gone, 60, lambda: run2.text()[-3000:])
        print(f"rollout: old incident resolved as gone {time.monotonic() - t_roll:.1f}s after the rollout")
        assert live.slack.messages[parent]["metadata"]["event_payload"]["state"] == "resolved"
        # past blind_spot_for (24 s) and the new pod's `for`: still nobody paged
        time.sleep(max(0.0, 27.0 - (time.monotonic() - t_roll)))
        assert parents(live, channel) == [parent], "the rollout paged"
        assert replies(live, channel, parent[1]) == [], "a gone target resolves quietly (no reply)"


def test_one_thread_per_engine_across_mode_changes(live: Live) -> None:
    channel = "#modes"
    target = live.targets["healthy-busy"][1]
    with ExitStack() as stack:
        # the hold-down spans the switch into oscillating: the restarted engine reads healthy until its
        # stand-in swing rule has seen two completed swings (one wave period or two, 6-16 s), and a
        # mode change is a reply only while the incident is still open
        run = live.kvwatch(stack, MODES_JOB, channel, live.tmp / "modes-state.json", "kvwatch-modes", hold_down="30s")
        wait(f"{FOR_S:g}s of healthy samples and two cycles", lambda: time.time() - live.started > FOR_S + 4
             and run.text().count("healthy 1") >= 2, 90, lambda: run.text()[-2000:])
        assert parents(live, channel) == []

        def switch(scenario: str) -> None:
            r = requests.post(f"{live.sim_url}/control/{target}", json={"scenario": scenario, "restart": True},
                              timeout=10)
            assert r.status_code == 200, r.text

        switch("full")
        (parent,) = wait("the full parent", lambda: parents(live, channel), 60, lambda: run.text()[-3000:])
        ts = parent[1]
        assert live.slack.messages[parent]["blocks"][0]["text"]["text"].startswith("FULL")
        switch("oscillating")

        def changed() -> list[dict[str, Any]]:
            return [r for r in replies(live, channel, ts) if "mode full → oscillating" in r.get("text", "")]

        wait("the mode change as a reply in the same thread", changed, 60, lambda: run.text()[-3000:])
        assert live.slack.messages[parent]["blocks"][0]["text"]["text"].startswith("OSCILLATING")
        switch("healthy-busy")

        def resolved() -> bool:
            # the sink updates the parent, then posts the reply: a poll between the two calls sees only
            # the first (a CI run at ce5ea1b read the replies 1 poll too early), so wait for both
            return "*RESOLVED*" in json.dumps(live.slack.messages[parent].get("blocks")) and any(
                "RESOLVED" in r.get("text", "") for r in replies(live, channel, ts))

        wait("the resolve on the parent and as a reply", resolved, 90, lambda: run.text()[-3000:])
        texts = [r.get("text", "") for r in replies(live, channel, ts)]
        print(f"modes: parents {len(parents(live, channel))}, replies {texts}")
        assert parents(live, channel) == [parent], "a mode change opened a second thread"
        assert sum("RESOLVED" in t for t in texts) == 1, "the resolve reply was posted once"
        assert live.slack.rejected == []


def test_slow_prometheus_and_slack_429_skip_no_cycle(live: Live) -> None:
    """Defect 9: Slack 429 retries and a slow Prometheus blocked the cycle and the scheduler skipped
    cycles. Now evaluation and delivery have deadlines: every interval has its cycle line, and the
    ones that could not evaluate say so."""
    from support.fault_proxy import Fault, FaultMode, FaultProxy

    channel = "#deadline"
    live.slack.fail_next(3, status=429, retry_after=3, method="chat.postMessage")
    with ExitStack() as stack:
        proxy = stack.enter_context(FaultProxy(live.prom))
        proxy.set(Fault(FaultMode.LATENCY, delay_s=2.5))
        t0 = time.monotonic()
        run = live.kvwatch(stack, DEADLINE_JOB, channel, live.tmp / "deadline-state.json", "kvwatch-deadline",
                           prom=proxy.url)
        wait("kvwatch up", lambda: "serving /metrics" in run.text(), 60)
        time.sleep(12)
        proxy.clear()  # Prometheus fast again; Slack still answers 429 to the first posts
        (parent,) = wait("the parent after the 429s", lambda: parents(live, channel), 60, lambda: run.text()[-3000:])
        time.sleep(4)
        lines = [ln for ln in run.text().splitlines() if "kvwatch cycle " in ln]
        elapsed = time.monotonic() - t0
    log = run.text()
    stamps = [time.mktime(time.strptime(ln[:19], "%Y-%m-%d %H:%M:%S")) for ln in lines]
    span = stamps[-1] - stamps[0]
    dropped = [ln for ln in lines if "dropped: evaluation" in ln]
    durations = [float(m.group(1)) for ln in lines if (m := re.search(r" in ([0-9.]+)s", ln))]
    posts = [c.status for c in live.slack.of("chat.postMessage", ok_only=False) if c.body.get("channel") == channel]
    print(f"deadline: {len(lines)} cycle lines over {span:.0f}s ({elapsed:.0f}s run), {len(dropped)} with a "
          f"dropped evaluation, longest cycle {max(durations):.2f}s; Slack parent posts {posts}")
    assert "maximum number of running instances" not in log and "skipped" not in log.lower(), log[-3000:]
    # one line per cycle: no scheduler job lines, no HTTP client retry lines (issue 17 item 15);
    # kvwatch's own cycle line says "last delivery error (will retry)" after a 429, as documented
    assert "Running job" not in log and "executed successfully" not in log
    others = [ln for ln in log.splitlines() if "kvwatch cycle " not in ln]
    assert not [ln for ln in others if "retry" in ln.lower() or "retrying" in ln.lower()], log[-3000:]
    assert any("(will retry): slack: http 429" in ln.lower() for ln in lines), "\n".join(lines)
    assert len(lines) >= span / 2.0 - 1, "cycles missing: the scheduler skipped some"
    assert dropped and all(d < 2.0 for d in durations), "\n".join(lines)
    assert posts == [429, 429, 429, 200] and parents(live, channel) == [parent]


def _panel_exprs(dashboard: Path, metric: str) -> list[str]:
    doc = json.loads(dashboard.read_text())
    out = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            walk(p.get("panels") or [])
            out.extend(t["expr"] for t in p.get("targets") or [] if metric in t.get("expr", ""))

    walk(doc.get("panels") or [])
    return out


def test_shipped_scrape_configs_keep_engine_labels_for_the_dashboards(live: Live) -> None:
    """Issue 17 item 16: the compose Prometheus config and the ServiceMonitor scrape kvwatch; its
    per-target series must keep the engine's job/instance (honor_labels) or every dashboard filter
    on an engine misses. Scrape a running kvwatch with the shipped job, then run the panels."""
    import yaml

    root = Path(__file__).resolve().parents[1]
    shipped = yaml.safe_load((root / "deploy" / "compose" / "prometheus.yml").read_text())
    (job,) = [j for j in shipped["scrape_configs"] if j["job_name"] == "kvwatch"]
    monitors = [d for d in yaml.safe_load_all((root / "deploy" / "kubernetes" / "service.yaml").read_text())
                if d and d.get("kind") == "ServiceMonitor"]
    # the ServiceMonitor's endpoint becomes the same scrape job in the Operator's generated config
    assert monitors[0]["spec"]["endpoints"][0].get("honorLabels") is True
    # whichever engine the rollout job scrapes now (before or after the rollout test moved it):
    # the test does not depend on the order the module's tests run in
    wait("an engine scraped in the rollout job", lambda: live.query(f'up{{job="{ROLLOUT_JOB}"}} == 1'), 30)
    target = live.query(f'up{{job="{ROLLOUT_JOB}"}} == 1')[0]["metric"]["instance"]
    with ExitStack() as stack:
        run = live.kvwatch(stack, ROLLOUT_JOB, "#shipped", live.tmp / "shipped-state.json", "kvwatch-shipped")
        port = kvwatch_port(run.log, run.popen)
        wait("two kvwatch cycles", lambda: run.text().count("kvwatch cycle ") >= 2, 60, lambda: run.text()[-2000:])
        job = {**job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}], "scrape_interval": "1s",
               "scrape_timeout": "1s"}
        prom = stack.enter_context(prometheus(config=yaml.safe_dump({"scrape_configs": [job]})))

        def series() -> list[dict[str, Any]]:
            q = f'kvwatch_target_state{{job="{ROLLOUT_JOB}", instance="{target}"}}'
            return requests.get(f"{prom}/api/v1/query", params={"query": q}, timeout=5).json()["data"]["result"]

        wait("kvwatch's per-target series under the engine's job", series, 30)
        exprs = _panel_exprs(root / "dashboards" / "kvwatch-instance.json", "kvwatch_target_state")
        exprs += _panel_exprs(root / "dashboards" / "kvwatch-fleet.json", "kvwatch_target_state")
        assert exprs
        for expr in exprs:
            q = expr.replace("$job", ROLLOUT_JOB).replace("$instance", target).replace("$__rate_interval", "1m")
            got = requests.get(f"{prom}/api/v1/query", params={"query": q}, timeout=5).json()["data"]["result"]
            assert got, f"dashboard query found nothing for the engine: {q}"
        print(f"shipped scrape config: {len(exprs)} dashboard queries return the engine {ROLLOUT_JOB}/{target}")
