"""Live simulator: many targets behind one HTTP port, on a (compressible) clock.

Endpoints: ``/targets/<name>/metrics`` (text format 0.0.4), ``/sd`` (Prometheus HTTP service
discovery), ``/targets`` (JSON manifest), ``POST /control/<name>`` with
``{"scenario": "<preset>"}`` (optionally ``"restart": true``), ``/healthz``.
Engines advance lazily to "now" when scraped; ``speed`` is simulated seconds per wall second.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from kvwatch.sim.engine import Engine
from kvwatch.sim.expose import exposition
from kvwatch.sim.fleet import TargetSpec, seed_of
from kvwatch.sim.scenarios import PRESETS, BuildContext, Replica, Segment

CONTENT_TYPE_004 = "text/plain; version=0.0.4"
MAX_CATCHUP_S = 3600.0  # simulated seconds stepped at most per request; older time is skipped


class LiveTarget:
    """One served target: its engines (data parallel) and current scenario."""

    def __init__(self, spec: TargetSpec, created_at: float) -> None:
        self.spec = spec
        self.scenario = spec.preset
        self.created_at = created_at
        self.lock = threading.Lock()
        self._segments: tuple[Segment, ...] = spec.replica.segments
        self._origin = 0.0  # simulated time at which ``_segments`` started
        self._next = 1
        seg = self._segments[0]
        self.engines = [Engine(seg.config, seg.workload, seed=seed_of(spec.seed, spec.name, e))
                        for e in range(spec.data_parallel)]

    def advance(self, sim_now: float) -> None:
        """Step the engines up to ``sim_now`` (call with ``lock`` held)."""
        for engine in self.engines:
            if sim_now - engine.t > MAX_CATCHUP_S:
                engine.t = sim_now - MAX_CATCHUP_S
            while engine.t + engine.cfg.dt <= sim_now:
                self._apply_segments(engine)
                engine.step()

    def _apply_segments(self, engine: Engine) -> None:
        while (self._next < len(self._segments)
               and self._origin + self._segments[self._next].start_s <= engine.t):
            seg = self._segments[self._next]
            engine.reconfigure(seg.config, seg.workload)
            self._next += 1

    def switch(self, preset: str, replica: Replica, sim_now: float, restart: bool) -> None:
        """Run ``replica``'s schedule from ``sim_now`` (a new pool size needs a restart)."""
        self.scenario, self._segments, self._origin, self._next = preset, replica.segments, \
            sim_now, 1
        seg = replica.segments[0]
        for i, engine in enumerate(self.engines):
            same_pool = (seg.config.num_blocks, seg.config.block_size) == (
                engine.cfg.num_blocks, engine.cfg.block_size)
            if same_pool and not restart:
                engine.reconfigure(seg.config, seg.workload)
                continue
            fresh = Engine(seg.config, seg.workload,
                           seed=seed_of(self.spec.seed, self.spec.name, i, preset))
            fresh.t = fresh.phase_start = engine.t
            self.engines[i] = fresh


class SimFleet:
    """Targets served live; ``clock`` is monotonic seconds, ``wall`` epoch seconds."""

    def __init__(self, specs: Sequence[TargetSpec], *, speed: float = 1.0,
                 warmup_s: float = 300.0, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        self.speed, self.warmup_s, self.clock, self.wall = speed, warmup_s, clock, wall
        self._t0 = clock()
        created = wall()
        self.targets = {s.name: LiveTarget(s, created) for s in specs}

    def sim_now(self) -> float:
        return self.warmup_s + (self.clock() - self._t0) * self.speed

    def metrics(self, name: str) -> str:
        target = self.targets[name]
        with target.lock:
            target.advance(self.sim_now())
            views = [e.view(self.wall()) for e in target.engines]
        return exposition(target.spec.dialect, views, target.spec.model_name,
                          created_at=target.created_at)

    def control(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        target = self.targets[name]
        preset = str(body.get("scenario", target.scenario))
        if preset not in PRESETS:
            raise ValueError(f"unknown scenario {preset!r}; choose from {sorted(PRESETS)}")
        spec = target.spec
        with target.lock:
            now = self.sim_now()
            target.advance(now)
            base = target.engines[0].cfg
            rng = np.random.default_rng(seed_of(spec.seed, preset, "live"))
            replicas = PRESETS[preset].build(BuildContext(base, rng, None))
            target.switch(preset, replicas[0], now, bool(body.get("restart", False)))
        return self.describe(name)

    def describe(self, name: str) -> dict[str, Any]:
        """Manifest entry; ``expected`` is this replica's mode (after a switch: the preset's)."""
        t = self.targets[name]
        spec = t.spec
        if t.scenario == spec.preset:
            expected, cause = spec.expected, spec.cause
        else:
            expected, cause = PRESETS[t.scenario].expected, PRESETS[t.scenario].cause
        return {"name": spec.name, "dialect": spec.dialect.value, "seed": spec.seed,
                "preset": spec.preset, "scenario": t.scenario, "expected": expected.value,
                "cause": cause.value if cause else None, "group": spec.group,
                "group_expected": spec.group_expected.value if spec.group_expected else None,
                "model_name": spec.model_name,
                "data_parallel": spec.data_parallel,
                "metrics_path": f"/targets/{spec.name}/metrics"}

    def sd(self, address: str) -> list[dict[str, Any]]:
        return [{"targets": [address],
                 "labels": {"__metrics_path__": f"/targets/{name}/metrics", "instance": name,
                            "kvwatch_sim_target": name}} for name in self.targets]


class _Handler(BaseHTTPRequestHandler):
    server: SimHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet: Prometheus scrapes often

    def _send(self, status: int, body: str | bytes, ctype: str) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status: int, doc: object) -> None:
        self._send(status, json.dumps(doc, indent=1) + "\n", "application/json")

    def do_GET(self) -> None:
        fleet, path = self.server.fleet, self.path.split("?", 1)[0].rstrip("/")
        parts = path.split("/")
        if path == "/healthz":
            self._send(HTTPStatus.OK, "ok\n", "text/plain")
        elif path == "/sd":
            host = self.headers.get("Host") or "{}:{}".format(*self.server.server_address[:2])
            self._json(HTTPStatus.OK, fleet.sd(self.server.advertise or host))
        elif path == "/targets":
            self._json(HTTPStatus.OK, [fleet.describe(n) for n in fleet.targets])
        elif len(parts) == 4 and parts[1] == "targets" and parts[3] == "metrics":
            if parts[2] not in fleet.targets:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"unknown target {parts[2]!r}"})
                return
            self._send(HTTPStatus.OK, fleet.metrics(parts[2]), CONTENT_TYPE_004)
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no route {path!r}"})

    def do_POST(self) -> None:
        fleet, parts = self.server.fleet, self.path.rstrip("/").split("/")
        if len(parts) != 3 or parts[1] != "control":
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path!r}"})
            return
        if parts[2] not in fleet.targets:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"unknown target {parts[2]!r}"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
            self._json(HTTPStatus.OK, fleet.control(parts[2], body))
        except ValueError as exc:  # includes JSON decode errors
            self._json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})


class SimHTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` serving a ``SimFleet``; use as a context manager."""

    daemon_threads = True

    def __init__(self, fleet: SimFleet, host: str = "127.0.0.1", port: int = 9400,
                 advertise: str | None = None) -> None:
        super().__init__((host, port), _Handler)
        self.fleet, self.advertise = fleet, advertise
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> SimHTTPServer:
        """Serve in a background thread."""
        self._thread = threading.Thread(target=self.serve_forever, name="kvwatch-sim",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the socket."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.server_close()

    def __enter__(self) -> SimHTTPServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
