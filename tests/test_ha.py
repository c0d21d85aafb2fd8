"""HA pair: two ``kvwatch run`` replicas page once, and the survivor finishes the episode.

Real processes: the live simulator, a Prometheus scraping it *and* both replicas'
/metrics (the Slack lease is read from the replicas' heartbeats there), two
Alertmanagers clustered over loopback gossip (``--cluster.listen-address`` /
``--cluster.peer``) that both replicas post to, a webhook receiver behind the
Alertmanager cluster, and the fake Slack. One fault episode: healthy → full
(the leader posts the Slack parent; Alertmanager notifies once) → the leader is
killed (SIGKILL) mid-episode → the follower takes over → healthy again (one
resolve in Slack, one resolved notification from Alertmanager).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
from support.fake_slack import fake_slack
from support.prom import kvwatch_port, on_free_ports, prometheus, require_binary, server_process
from test_alertmanager import webhook_receiver
from test_service_e2e import FIXTURES, TOKEN, Proc, clean_env, cycle_lines, spawn, value

pytestmark = [pytest.mark.prometheus, pytest.mark.alertmanager, pytest.mark.slow, pytest.mark.live]

CHANNEL = "#kvwatch-ha"
INTERVAL_S = 2.0  # evaluation.interval of tests/fixtures/e2e/config.yaml


@contextmanager
def am_cluster(hook: str, work: Path) -> Iterator[list[str]]:
    """Two Alertmanagers gossiping on loopback, both notifying ``hook``; yields their URLs."""
    binary = require_binary("prometheus-alertmanager", "alertmanager")
    cfg = work / "am.yml"
    cfg.write_text(
        # group_interval well above peer_timeout, as in production (5m vs 15s): the second member
        # waits peer_timeout before it checks the notification log, so a flush taken just before the
        # resolve would otherwise send a stale "firing" after the first member's "resolved"
        "route:\n  receiver: rec\n  group_by: ['alertname', 'instance']\n  group_wait: 1s\n"
        "  group_interval: 30s\n  repeat_interval: 1h\n"
        f"receivers:\n  - name: rec\n    webhook_configs:\n      - url: {hook}\n        send_resolved: true\n")

    @contextmanager
    def start(ports: list[int]) -> Iterator[list[str]]:
        web, gossip = ports[:2], ports[2:]
        with ExitStack() as stack:
            urls = []
            for i in (0, 1):
                args = [binary, f"--config.file={cfg}", f"--storage.path={work / f'am{i}'}",
                        f"--web.listen-address=127.0.0.1:{web[i]}",
                        f"--cluster.listen-address=127.0.0.1:{gossip[i]}",
                        f"--cluster.peer=127.0.0.1:{gossip[1 - i]}",
                        "--cluster.gossip-interval=100ms", "--cluster.pushpull-interval=1s",
                        "--cluster.peer-timeout=2s", "--cluster.settle-timeout=2s"]
                url = f"http://127.0.0.1:{web[i]}"
                stack.enter_context(server_process(args, f"{url}/-/ready", work / f"am{i}.log", timeout=30))
                urls.append(url)
            yield urls

    # a member that lost one of its four ports (web or gossip) restarts the pair on fresh ones
    with on_free_ports(start, n=4) as urls:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # both members see each other before alerts flow
            peers = [len(requests.get(f"{u}/api/v2/status", timeout=5).json()["cluster"].get("peers") or [])
                     for u in urls]
            if min(peers) >= 2:
                break
            time.sleep(0.2)
        else:
            logs = "\n".join(f"--- am{i}.log:\n" + (work / f"am{i}.log").read_text(errors="replace")[-2000:]
                             for i in (0, 1))
            raise AssertionError(f"the Alertmanager cluster did not form (peers seen: {peers})\n{logs}")
        yield urls


def _wait(what: str, probe: Any, limit_s: float, procs: list[Proc]) -> Any:
    end = time.monotonic() + limit_s
    while True:
        for p in procs:
            if p.popen.poll() is not None:
                raise AssertionError(f"{p.name} exited with {p.popen.returncode} while waiting for {what}:\n"
                                     f"{p.text()[-3000:]}")
        try:
            got = probe()
        except requests.RequestException:
            got = None
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {limit_s:g}s waiting for {what}")
        time.sleep(0.25)


def test_ha_pair_pages_once_and_survives_a_dead_replica(tmp_path: Path) -> None:
    require_binary("prometheus")
    work = Path(tempfile.mkdtemp(prefix="kvwatch-ha-"))
    procs: list[Proc] = []
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        slack = stack.enter_context(fake_slack())
        hook, got = stack.enter_context(webhook_receiver())
        ams = stack.enter_context(am_cluster(hook, work))
        sim = stack.enter_context(spawn(
            "simulator", ["simulate", "serve", "--host", "127.0.0.1", "--port", "0", "--presets", "healthy-busy",
                          "--dialects", "vllm-0.33", "--speed", "30"], tmp_path / "sim.log", clean_env()))
        procs.append(sim)
        sim_url = _wait("the simulator's URL", lambda: (m := re.search(r"on (http://127\.0\.0\.1:\d+)", sim.text()))
                        and m.group(1), 30, procs)
        (target,) = [t["name"] for t in requests.get(f"{sim_url}/targets", timeout=10).json()]
        # the replicas listen on ports the kernel picks (no port to lose before they bind); Prometheus
        # learns them through a file_sd file written once both have said where they serve
        sd = work / "kvwatch-sd.json"
        sd.write_text("[]")
        prom = stack.enter_context(prometheus(config=(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            f"scrape_configs:\n  - job_name: engines\n    http_sd_configs:\n"
            f"      - url: {sim_url}/sd\n        refresh_interval: 5s\n"
            "  - job_name: kvwatch\n    file_sd_configs:\n"
            f"      - files: ['{sd}']\n        refresh_interval: 1s\n")))
        replicas: dict[str, Proc] = {}
        for rid in ("a", "b"):
            env = clean_env(SLACK_BOT_TOKEN=TOKEN, SLACK_CHANNEL=CHANNEL, KVWATCH_SLACK_API_URL=slack.api_url,
                            KVWATCH_HA_REPLICA=rid, KVWATCH_ALERTMANAGER_URLS=",".join(ams),
                            KVWATCH_DISCOVERY_SELECTOR='{job="engines"}')
            replicas[rid] = stack.enter_context(spawn(
                f"kvwatch {rid}", ["run", "--config", str(FIXTURES / "config.yaml"), "--rules",
                                   str(FIXTURES / "rules.yaml"), "--prometheus-url", prom,
                                   "--state", str(tmp_path / f"{rid}.db"), "--listen", "127.0.0.1:0"],
                tmp_path / f"kvwatch-{rid}.log", env))
            procs.append(replicas[rid])
        a, b = replicas["a"], replicas["b"]
        ports = {rid: kvwatch_port(p.log, p.popen, 60) for rid, p in replicas.items()}
        tmp_sd = work / ".kvwatch-sd.json"  # replaced atomically: Prometheus watches the file
        tmp_sd.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}" for port in ports.values()]}]))
        tmp_sd.replace(sd)

        def metrics(rid: str) -> str:
            return requests.get(f"http://127.0.0.1:{ports[rid]}/metrics", timeout=5).text

        def diag() -> str:
            out = [f"--- {p.name}:\n" + "\n".join(p.text().splitlines()[-40:]) for p in procs]
            out.append("--- slack: " + "\n".join(f"{c.method} thread={c.body.get('thread_ts')} "
                                                 f"{str(c.body.get('text'))[:100]!r}" for c in slack.calls))
            out.append("--- alertmanager webhook: " + "\n".join(
                f"{n['status']} from {n['externalURL']}: " + ", ".join(
                    f"{a['status']} {a['startsAt']}..{a['endsAt']}" for a in n["alerts"]) for n in got))
            return "\n".join(out)

        try:
            # both replicas run; a (the lower id) leads once both heartbeats are in Prometheus
            _wait("a leads and b follows", lambda: "HA replica a is leader" in a.text()
                  and "HA replica b is follower (leader a" in b.text(), 60, procs)
            # before the fault: at start-up, b may lead alone for a cycle until a's heartbeat has been
            # visible for a whole lease (nothing to post then); from here on a leads
            settled = b.text().index("HA replica b is follower (leader a")
            requests.post(f"{sim_url}/control/{target}", json={"scenario": "full"}, timeout=10).raise_for_status()
            parent = _wait("the Slack parent", lambda: [c for c in slack.of("chat.postMessage")
                                                         if not c.body.get("thread_ts")], 60, procs)
            _wait("Alertmanager's firing notification", lambda: any(n["status"] == "firing" for n in got), 30, procs)
            # b saw the same incident; it must not post, and it drops its copy once a's heartbeat passes it
            _wait("b tracks the incident too", lambda: value(metrics("b"), "kvwatch_incidents_open", mode="full",
                                                               severity="critical") == 1, 20, procs)
            time.sleep(3 * INTERVAL_S)
            assert len([c for c in slack.of("chat.postMessage") if not c.body.get("thread_ts")]) == 1, diag()
            # mid-episode: the leader dies without a word
            a.popen.send_signal(signal.SIGKILL)
            a.popen.wait(timeout=10)
            procs.remove(a)
            killed, seen = time.monotonic(), len(b.text())
            _wait("b takes over", lambda: "HA replica b is leader" in b.text()[seen:], 30, procs)
            takeover_s = time.monotonic() - killed
            b_cycles = len(cycle_lines(b.text()[seen:]))
            requests.post(f"{sim_url}/control/{target}", json={"scenario": "healthy-busy", "restart": True},
                          timeout=10).raise_for_status()

            def resolved_once() -> bool:
                replies = [c for c in slack.of("chat.postMessage") if c.body.get("thread_ts")
                           and "RESOLVED" in str(c.body.get("text"))]
                return bool(replies) and any(n["status"] == "resolved" for n in got)

            _wait("the resolve in Slack and from Alertmanager", resolved_once, 90, procs)
            time.sleep(4 * INTERVAL_S)  # anything duplicated would arrive now
        except BaseException:
            print(diag())
            raise
        parents_firing = [c for c in slack.of("chat.postMessage") if not c.body.get("thread_ts")
                          and "FIRING" in str(c.body.get("blocks"))]
        resolves = [c for c in slack.of("chat.postMessage") if c.body.get("thread_ts")
                    and "RESOLVED" in str(c.body.get("text"))]
        assert len(parents_firing) == 1, diag()
        assert len(resolves) == 1, diag()
        # the survivor found the dead leader's parent (Slack message metadata) and resolved in its thread
        parents = [c for c in slack.of("chat.postMessage") if not c.body.get("thread_ts")]
        (ts,) = [ts for (ch, ts), body in slack.messages.items() if ch == CHANNEL and not body.get("thread_ts")]
        assert len(parents) == 1 and resolves[0].body["thread_ts"] == ts, diag()
        assert parent[0] is not None
        firing = [n for n in got if n["status"] == "firing"]
        resolved = [n for n in got if n["status"] == "resolved"]
        assert len(firing) == 1 and len(resolved) == 1, diag()
        assert value(metrics("b"), "kvwatch_notifications_total", sink="slack", outcome="ok") == 1, diag()
        print(f"takeover {takeover_s:.1f}s after the kill ({takeover_s / INTERVAL_S:.1f} intervals; "
              f"b's cycles until then: {b_cycles})")
        assert "HA replica b is leader" not in b.text()[settled:seen], "b led while a was alive and leading"
        assert takeover_s <= 3 * INTERVAL_S + 2.0, f"takeover took {takeover_s:.1f}s"
