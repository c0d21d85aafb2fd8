"""``kvwatch demo``: every failure mode, simulated and diagnosed in the terminal.

Two backends run the same rules and renderer:

* ``prometheus`` — the simulated fleet is written as OpenMetrics, backfilled with
  ``promtool`` into a throwaway Prometheus (temp dir, free loopback port) and the
  full pipeline (discovery, PromQL collection, diagnosis) runs against it;
* ``inprocess`` — no binaries needed: the simulator's ground-truth series are turned
  into :class:`~kvwatch.fleetdata.FleetData` (rates and histogram quantiles computed
  as Prometheus would) and passed straight to :func:`kvwatch.diagnose.diagnose`.

Every process and temp dir the demo starts is removed on exit, error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
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
    from kvwatch.models import Evaluation

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
    return Backend.PROMETHEUS if find_binaries() and _openmetrics_available() else Backend.INPROCESS


def _openmetrics_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("kvwatch.sim.openmetrics") is not None


def _cmd(args: argparse.Namespace) -> int:
    from kvwatch.cli import EXIT_OK, EXIT_USAGE
    from kvwatch.config import load_settings
    from kvwatch.render import to_text
    from kvwatch.ruleset import load_ruleset

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

                evaluation, expected = evaluate_via_prometheus(settings, rules, args.seed, WARMUP_S, progress)
            else:
                from kvwatch.demo.inprocess import evaluate_inprocess

                evaluation, expected = evaluate_inprocess(settings, rules, args.seed, WARMUP_S, progress)
        finally:
            progress.done()
    if args.format == "json":
        doc = evaluation.to_json()
        doc["demo"] = {"backend": backend.value, "seed": args.seed, "expected": expected}
        sys.stdout.write(json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n")
    else:
        sys.stdout.write(to_text(evaluation))
        sys.stdout.write(scenario_table(evaluation, expected))
        print(f"\n(backend: {backend.value}; simulated fleet, seed {args.seed}; "
              f"evaluated at {evaluation.evaluated_at.astimezone(UTC):%Y-%m-%d %H:%M:%S}Z)")
    return EXIT_OK


def scenario_table(evaluation: Evaluation, expected: dict[str, str]) -> str:
    """Each simulated engine: the mode its scenario was built to show next to kvwatch's state."""
    lines = ["", "Scenarios (simulated ground truth vs kvwatch):"]
    for r in evaluation.results:
        want = expected.get(str(r.target.key), "?")
        d = r.primary
        got = r.state.value + (f" ({d.cause})" if d is not None and d.cause else "")
        mark = "ok" if want.split(" ")[0] == r.state.value else "differs"
        lines.append(f"  {r.target.key!s:<34} expected {want:<24} got {got:<24} {mark}")
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


def now() -> datetime:
    """The evaluation instant: the current minute (simulated data ends here)."""
    return datetime.now(tz=UTC).replace(second=0, microsecond=0)
