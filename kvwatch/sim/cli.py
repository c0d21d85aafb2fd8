"""``kvwatch simulate``: list presets/dialects, backfill a labelled corpus, serve live targets.

The main CLI calls ``add_parser(subparsers)``; each sub-command sets ``func`` taking the
argparse Namespace and returning an exit code (0 ok, 1 tool failure, 2 bad usage).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from kvwatch.sim.corpus import build_corpus, default_end_time, plan
from kvwatch.sim.openmetrics import DEFAULT_JOB, PromtoolError, backfill
from kvwatch.sim.scenarios import PRESETS
from kvwatch.sim.server import SimFleet, SimHTTPServer
from kvwatch.sim.vocab import Dialect

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class UsageError(ValueError):
    """Bad command-line input (exit code 2)."""


def parse_duration(text: str) -> float:
    """``"40m"``, ``"90s"``, ``"1h30m"`` or plain seconds -> seconds."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhd])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise UsageError(f"bad duration {text!r} (e.g. 40m, 90s, 1h30m)")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def parse_time(text: str) -> float:
    """RFC 3339 (``2026-11-29T10:00:00Z``) or epoch seconds -> epoch seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise UsageError(f"bad time {text!r} (RFC 3339, e.g. 2026-11-29T10:00:00Z)") from exc
    if stamp.tzinfo is None:
        raise UsageError(f"time {text!r} needs a timezone (e.g. Z)")
    return stamp.timestamp()


def _names(values: list[str] | None, known: list[str], what: str) -> list[str] | None:
    if not values:
        return None
    names = [n for v in values for n in v.split(",") if n]
    if names == ["all"]:
        return None
    bad = [n for n in names if n not in known]
    if bad:
        raise UsageError(f"unknown {what} {', '.join(bad)}; choose from {', '.join(known)}")
    return names


def _selection(args: argparse.Namespace) -> tuple[list[str] | None, list[str] | None]:
    return (_names(args.presets, list(PRESETS), "preset"),
            _names(args.dialects, [d.value for d in Dialect], "dialect"))


def cmd_list(args: argparse.Namespace) -> int:
    presets = [{"name": p.name, "expected": p.expected.value,
                "cause": p.cause.value if p.cause else None, "description": p.description}
               for p in PRESETS.values()]
    dialects = [{"name": d.value, "engine": d.engine} for d in Dialect]
    if args.json:
        print(json.dumps({"presets": presets, "dialects": dialects}, indent=1))
        return 0
    print("presets:")
    for p in presets:
        label = p["expected"] + (f"/{p['cause']}" if p["cause"] else "")
        print(f"  {p['name']:22s} {label:22s} {p['description']}")
    print("dialects:")
    for d in dialects:
        print(f"  {d['name']:22s} {d['engine']}")
    return 0


def _writable_dir(path: str, flag: str) -> Path:
    """Create ``path`` if needed; a directory kvwatch cannot write is a usage error, before any work."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag}: cannot create {path!r}: {exc.strerror or exc}") from None
    if not out.is_dir() or not os.access(out, os.W_OK | os.X_OK):
        raise UsageError(f"{flag}: {path!r} is not a writable directory")
    return out


def cmd_backfill(args: argparse.Namespace) -> int:
    _writable_dir(args.out, "--out")
    if args.tsdb:
        _writable_dir(args.tsdb, "--tsdb")
    presets, dialects = _selection(args)
    end = parse_time(args.end) if args.end else default_end_time()
    started = time.monotonic()
    doc = build_corpus(args.out, presets=presets, dialects=dialects, seeds=args.seeds,
                       duration_s=parse_duration(args.duration),
                       warmup_s=parse_duration(args.warmup),
                       scrape_interval_s=parse_duration(args.interval), end_time=end,
                       job=args.job, full_cross=args.full_cross, workers=args.workers)
    out = Path(args.out)
    invalid = [t["name"] for t in doc["targets"] if not t["validation"]["ok"]]
    print(f"{len(doc['targets'])} targets, {doc['stats']['samples']} samples, "
          f"{doc['start']} .. {doc['end']} -> {out / 'fleet.om'}, {out / 'manifest.json'} "
          f"({time.monotonic() - started:.1f}s)")
    if invalid:
        print(f"warning: {len(invalid)} targets do not show their expected mode in ground "
              f"truth: {', '.join(invalid)}", file=sys.stderr)
    if args.tsdb:
        try:
            backfill(out / "fleet.om", args.tsdb)
        except PromtoolError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"TSDB blocks in {args.tsdb} ({time.monotonic() - started:.1f}s total)")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port: got {args.port}, expected 0-65535")
    presets, dialects = _selection(args)
    specs = plan(presets, dialects, args.seeds, run_s=None, full_cross=args.full_cross)
    fleet = SimFleet(specs, speed=args.speed)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server_cm = SimHTTPServer(fleet, args.host, args.port, advertise=args.advertise)
    except OSError as exc:  # port in use, address not local, permission denied
        raise UsageError(f"--host/--port: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    with server_cm as server:
        print(f"serving {len(specs)} simulated targets on {server.url} "
              f"(speed x{args.speed}): /sd /targets /targets/<name>/metrics "
              f"POST /control/<name> /healthz", flush=True)
        stop.wait()
    print("stopped", flush=True)
    return 0


def _guard(func: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except UsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    return run


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``simulate`` and its sub-commands on the main CLI's ``subparsers``."""
    parser = subparsers.add_parser(
        "simulate", help="simulated inference engines (corpus backfill, live targets)",
        description="Mechanistic simulator of vLLM / SGLang / TensorRT-LLM instances.")
    parser.set_defaults(func=lambda _args: parser.print_help() or 2)
    sub = parser.add_subparsers(dest="simulate_command", metavar="COMMAND")

    p_list = sub.add_parser("list", help="scenario presets and metric dialects")
    p_list.add_argument("--json", action="store_true", help="machine-readable output")
    p_list.set_defaults(func=_guard(cmd_list))

    def selection(p: argparse.ArgumentParser, seeds: int) -> None:
        p.add_argument("--presets", nargs="+", metavar="NAME",
                       help="preset names, comma or space separated, or 'all' (default)")
        p.add_argument("--dialects", nargs="+", metavar="ID",
                       help="dialect ids (default: all), e.g. vllm-0.33 sglang-0.5")
        p.add_argument("--seeds", type=int, default=seeds, help=f"seeds (default {seeds})")
        p.add_argument("--full-cross", action="store_true",
                       help="every preset x dialect (default: dialects rotate over presets)")

    p_bf = sub.add_parser("backfill", help="write a labelled corpus as OpenMetrics + manifest")
    p_bf.add_argument("--out", required=True, help="output directory (fleet.om, manifest.json)")
    selection(p_bf, 4)
    p_bf.add_argument("--duration", default="40m", help="exported span (default 40m)")
    p_bf.add_argument("--warmup", default="5m", help="simulated before the span (default 5m)")
    p_bf.add_argument("--interval", default="15s", help="scrape interval (default 15s)")
    p_bf.add_argument("--end", help="end of the span, RFC 3339 (default: 1 h ago, minute)")
    p_bf.add_argument("--job", default=DEFAULT_JOB, help=f"job label (default {DEFAULT_JOB})")
    p_bf.add_argument("--tsdb", help="also run promtool to create TSDB blocks in this dir")
    p_bf.add_argument("--workers", type=int, help="simulation processes (default: CPUs)")
    p_bf.set_defaults(func=_guard(cmd_backfill))

    p_sv = sub.add_parser("serve", help="serve live simulated targets over HTTP")
    p_sv.add_argument("--host", default="127.0.0.1",
                      help="bind address (default 127.0.0.1; 0.0.0.0 in a container)")
    p_sv.add_argument("--port", type=int, default=9400, help="port (default 9400)")
    p_sv.add_argument("--advertise", help="HOST:PORT put in /sd (default: request Host)")
    selection(p_sv, 1)
    p_sv.add_argument("--speed", type=float, default=1.0,
                      help="simulated seconds per wall second (default 1)")
    p_sv.set_defaults(func=_guard(cmd_serve))
    return parser
