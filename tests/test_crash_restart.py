"""Issue 17 acceptance: delivery survives kill -9 and bad state files (real processes throughout).

One live simulator target in ``full`` scraped every second by a real Prometheus; for each
scenario a real ``kvwatch run`` with its own state file and its own (fake) Slack channel:

* ``before-post``: killed -9 when its parent ``chat.postMessage`` arrives (not processed);
* ``after-post``: killed -9 after Slack stored the parent, before kvwatch saw the ``ts``;
* ``after-record``: killed -9 once the parent is recorded in the state file;
* ``corrupt``: as after-record, then the state file is overwritten with garbage;
* ``unwritable``: the state file can never be written (continues in memory, one log line).

Each is restarted on the same state file. Then the target recovers and every incident must
resolve in its one thread (one ``after-post`` resolve reply is also killed -9 mid-delivery).
Figures: parents per channel (must be 1) and resolved parents (must be all).
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import requests
from support.fake_slack import FakeSlack, fake_slack
from support.polling import wait as poll
from support.prom import prometheus, require_binary
from test_service_e2e import FIXTURES, TOKEN, clean_env, spawn

pytestmark = [pytest.mark.prometheus, pytest.mark.slow, pytest.mark.live]

JOB = "kvwatch-crash"
SCENARIOS = ("before-post", "after-post", "after-record", "corrupt", "unwritable")


#: the kill scenarios poll a little faster than the shared default
wait = partial(poll, poll_s=0.2)


class Killer:
    """Arms the fake Slack to kill -9 a kvwatch process at one step of a delivery."""

    def __init__(self, slack: FakeSlack) -> None:
        self.armed: dict[tuple[str, str, str, bool], int] = {}  # (method, phase, channel, reply) → pid
        self.lock = threading.Lock()
        slack.hook = self.hook

    def arm(self, method: str, phase: str, channel: str, reply: bool, pid: int) -> None:
        with self.lock:
            self.armed[(method, phase, channel, reply)] = pid

    def hook(self, method: str, phase: str, body: dict[str, Any]) -> None:
        key = (method, phase, str(body.get("channel", "")), bool(body.get("thread_ts")))
        with self.lock:
            pid = self.armed.pop(key, None)
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL)
        if phase == "before":
            raise ConnectionAbortedError("killed before the call was processed")  # nothing stored


def state_doc(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())["state"]
    except (OSError, ValueError, KeyError):
        return {}


def resolved(slack: FakeSlack, channel: str) -> bool:
    return any("*RESOLVED*" in json.dumps(slack.messages[p].get("blocks")) for p in slack.parents(channel))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeSlack, str, str, str, Path]]:
    require_binary("prometheus")
    tmp = tmp_path_factory.mktemp("crash")
    with ExitStack() as stack:
        slack = stack.enter_context(fake_slack())
        sim = stack.enter_context(spawn("simulator", ["simulate", "serve", "--host", "127.0.0.1", "--port", "0",
                                                      "--presets", "full", "--dialects", "vllm-0.33", "--speed", "30"],
                                        tmp / "sim.log", clean_env()))
        url = wait("the simulator's URL", lambda: (m := re.search(r"on (http://127\.0\.0\.1:\d+)", sim.text()))
                   and m.group(1), 30)
        (target,) = [t["name"] for t in requests.get(f"{url}/targets", timeout=10).json()]
        cfg = (f"global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: {JOB}\n"
               f"    http_sd_configs:\n      - url: {url}/sd\n        refresh_interval: 5s\n")
        prom = stack.enter_context(prometheus(config=cfg))
        yield slack, url, target, prom, tmp


def start(live: tuple[FakeSlack, str, str, str, Path], stack: ExitStack, name: str, n: int) -> Any:
    slack, _, _, prom, tmp = live
    env = clean_env(SLACK_BOT_TOKEN=TOKEN, SLACK_CHANNEL=f"#crash-{name}", KVWATCH_SLACK_API_URL=slack.api_url)
    return stack.enter_context(spawn(
        f"kvwatch {name} #{n}",
        ["run", "--config", str(FIXTURES / "config.yaml"), "--rules", str(FIXTURES / "rules.yaml"),
         "--prometheus-url", prom, "--state", str(tmp / f"{name}.json"), "--listen", "127.0.0.1:0"],
        tmp / f"{name}-{n}.log", env))


def test_kill_and_bad_state_never_duplicate_parents_nor_lose_resolves(
    live: tuple[FakeSlack, str, str, str, Path]
) -> None:
    slack, sim_url, target, _, tmp = live
    killer = Killer(slack)
    blocker = tmp / ".unwritable.json.tmp"
    blocker.mkdir()  # the state file's temporary file cannot be created: every write fails
    procs: dict[str, Any] = {}
    with ExitStack() as stack:
        for name in SCENARIOS:
            ch = f"#crash-{name}"
            p = start(live, stack, name, 1)
            if name in ("before-post", "after-post"):
                killer.arm("chat.postMessage", name.split("-")[0], ch, False, p.popen.pid)
                wait(f"{name}: kill -9", lambda p=p: p.popen.poll() is not None, 60)
            else:
                wait(f"{name}: the parent", lambda ch=ch: slack.parents(ch), 60)
                if name != "unwritable":
                    wait(f"{name}: the parent recorded", lambda name=name: state_doc(tmp / f"{name}.json").get("threads"), 10)
                p.popen.send_signal(signal.SIGKILL)
                p.popen.wait(timeout=10)
                if name == "corrupt":
                    (tmp / f"{name}.json").write_bytes(b"\x00garbage" * 64)
            assert p.popen.poll() == -signal.SIGKILL, f"{name}: not killed"
            procs[name] = start(live, stack, name, 2)
        for name in SCENARIOS:
            wait(f"{name}: a parent after the restart", lambda ch=f"#crash-{name}": slack.parents(ch), 60)
        time.sleep(4)  # two more cycles each: time for any duplicate to appear
        killer.arm("chat.postMessage", "after", "#crash-after-post", True, procs["after-post"].popen.pid)
        r = requests.post(f"{sim_url}/control/{target}", json={"scenario": "healthy-busy", "restart": True},
                          timeout=10)
        assert r.status_code == 200
        wait("after-post: kill -9 after the resolve reply", lambda: procs["after-post"].popen.poll() is not None, 60)
        procs["after-post"] = start(live, stack, "after-post", 3)
        wait("every thread resolved", lambda: all(resolved(slack, f"#crash-{n}") for n in SCENARIOS), 60,
             lambda: {n: resolved(slack, f"#crash-{n}") for n in SCENARIOS})
        parents = {n: len(slack.parents(f"#crash-{n}")) for n in SCENARIOS}
        done = {n: resolved(slack, f"#crash-{n}") for n in SCENARIOS}
        print(f"crash suite: parents per channel {parents}; resolved {done}")
        assert parents == dict.fromkeys(SCENARIOS, 1), parents
        assert all(done.values())
        logs = {n: "".join(f.read_text() for f in sorted(tmp.glob(f"{n}-*.log"))) for n in SCENARIOS}
        assert "is corrupt" in logs["corrupt"] and list(tmp.glob("corrupt.json.corrupt-*"))
        second = (tmp / "unwritable-2.log").read_text()
        assert second.count("keeping state in memory") == 1, second
        assert "kvwatch cycle ok" in second
        for n, p in procs.items():  # a clean stop needs the signal handlers installed (slow under load)
            wait(f"{n}: started", lambda p=p: "serving /metrics" in p.text(), 60)
            p.popen.send_signal(signal.SIGTERM)
        for n, p in procs.items():
            assert p.popen.wait(timeout=15) == 0, f"{n}: {p.text()[-2000:]}"
