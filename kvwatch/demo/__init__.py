"""``kvwatch demo``: every failure mode, simulated and diagnosed in the terminal.

Two backends run the same rules and renderer:

* ``prometheus`` — the simulated fleet is written as OpenMetrics, backfilled with
  ``promtool`` into a throwaway Prometheus (temp dir, free loopback port) and the
  full pipeline (discovery, PromQL collection, diagnosis) runs against it;
* ``inprocess`` — no binaries needed: each simulated engine's exposed series (its
  dialect's real names) go through discovery's dialect detection, and every resolved
  source is evaluated on them as its PromQL would be (:mod:`kvwatch.demo.promlite`);
  the resulting :class:`~kvwatch.core.frame.FleetData` goes to :func:`kvwatch.core.diagnose.diagnose`.

Both simulate the same fleet (:mod:`kvwatch.demo.fleet`) ending at the current minute.
Every process and temp dir the demo starts is removed on exit, error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from types import FrameType
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from kvwatch.config import Settings
    from kvwatch.core.models import Evaluation

#: simulated seconds before the evaluation window (engines reach steady state)
WARMUP_S = 600.0


class Backend(StrEnum):
    AUTO = "auto"
    PROMETHEUS = "prometheus"
    INPROCESS = "inprocess"


class Progress:
    """One-line progress on a terminal (rewritten in place), plain lines otherwise."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream, self.tty = stream, stream.isatty()
        self.t0 = time.monotonic()

    def __call__(self, msg: str) -> None:
        line = f"kvwatch demo {time.monotonic() - self.t0:5.1f}s  {msg}"
        if self.tty:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so ``finally`` blocks clean up as on Ctrl-C."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def pick_backend(choice: Backend) -> Backend:
    from kvwatch.demo.promrun import find_binaries

    if choice is not Backend.AUTO:
        return choice
    return Backend.PROMETHEUS if find_binaries() else Backend.INPROCESS


def _cmd(args: argparse.Namespace) -> int:
    from kvwatch.cli import EXIT_OK, EXIT_USAGE
    from kvwatch.config import load_settings
    from kvwatch.core.report import to_text
    from kvwatch.core.rules import load_ruleset

    settings = load_settings(None, environ={})  # the demo ignores the caller's env/config
    rules = load_ruleset(args.rules or ())
    backend = pick_backend(Backend(args.backend))
    progress = Progress()
    with _sigterm_as_interrupt():
        try:
            if backend is Backend.PROMETHEUS:
                from kvwatch.demo.promrun import find_binaries

                if not find_binaries():
                    print("kvwatch: demo --backend prometheus needs `prometheus` and `promtool` on PATH",
                          file=sys.stderr)
                    return EXIT_USAGE
                from kvwatch.demo.viaprom import evaluate_via_prometheus

                evaluation, fleet = evaluate_via_prometheus(settings, rules, args.seed, WARMUP_S, progress)
            else:
                from kvwatch.demo.inprocess import evaluate_inprocess

                evaluation, fleet = evaluate_inprocess(settings, rules, args.seed, WARMUP_S, progress)
        finally:
            progress.done()
    if args.format == "json":
        doc = evaluation.to_json()
        doc["demo"] = {
            "backend": backend.value, "seed": args.seed, "expected": fleet.expected(),
            "groups": {g: {"expected": mode, "members": list(members)}
                       for g, (mode, members) in fleet.groups().items()},
        }
        sys.stdout.write(json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n")
    else:
        sys.stdout.write(to_text(evaluation))
        sys.stdout.write(scenario_table(evaluation, fleet.expected(), fleet.groups()))
        print(f"\n(backend: {backend.value}; simulated fleet, seed {args.seed}; "
              f"evaluated at {evaluation.evaluated_at.astimezone(UTC):%Y-%m-%d %H:%M:%S}Z)")
    return EXIT_OK


def scenario_table(evaluation: Evaluation, expected: dict[str, str],
                   groups: dict[str, tuple[str, tuple[str, ...]]] | None = None) -> str:
    """Each simulated engine: the mode (and idle cause) its scenario was built to show next
    to kvwatch's primary state and cause; then each replica group's mode against the
    modes kvwatch names on any of its members (primary or secondary)."""
    rows: list[tuple[str, str, str, str]] = []
    for r in evaluation.results:
        want = expected.get(str(r.target.key), "?")
        d = r.primary
        got = r.state.value + (f" ({d.cause})" if d is not None and d.cause else "")
        also = sorted({x.mode.value for x in r.diagnoses} - {r.state.value})
        want_state, _, want_cause = want.partition(" ")
        ok = want_state == r.state.value and (not want_cause or want_cause == f"({d.cause if d else ''})")
        rows.append((str(r.target.key), want, got + (f" +{'+'.join(also)}" if also else ""),
                     "ok" if ok else "DIFFERS"))
    width = max((len(k) for k, *_ in rows), default=10)
    lines = ["", "Scenarios (simulated ground truth vs kvwatch):"]
    lines += [f"  {k:<{width}}  expected {w:<24} got {g:<30} {m}" for k, w, g, m in rows]
    by_key = {str(r.target.key): r for r in evaluation.results}
    for name, (mode, members) in (groups or {}).items():
        named = {str(x.mode.value) for m in members if m in by_key for x in by_key[m].diagnoses}
        mark = "ok" if mode in named else "DIFFERS"
        lines.append(f"  group {name} ({len(members)} replicas): expected {mode} on a member,"
                     f" kvwatch names {', '.join(sorted(named)) or 'nothing'}  {mark}")
    return "\n".join(lines) + "\n"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="simulate every failure mode and diagnose it (no setup needed)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--backend", choices=[b.value for b in Backend], default=Backend.AUTO.value,
                   help="auto: prometheus when `prometheus` and `promtool` are on PATH, else inprocess")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--seed", type=int, default=1, help="random seed of the simulated traffic")
    p.add_argument("--rules", metavar="PATH", action="append", help="rule file or directory (repeatable)")
    p.set_defaults(func=_cmd)


def fleet_duration(settings: Settings) -> float:
    """Simulated seconds of scraped data: the window plus the longest lookback of a
    ``rate()``/quantile at its first point, a step of slack, rounded up to the minute."""
    ev = settings.evaluation
    lookback = max(ev.rate_window, float(getattr(ev, "latency_window", 0.0) or 0.0))
    return float(math.ceil((ev.window + lookback + ev.step) / 60.0) * 60)


def now() -> datetime:
    """The evaluation instant: the current minute (simulated data ends here)."""
    return datetime.now(tz=UTC).replace(second=0, microsecond=0)
