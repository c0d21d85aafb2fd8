"""``kvwatch backtest``: replay discover → collect → diagnose → lifecycle over Prometheus history."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvwatch.durations import parse_duration


def add_parser(subparsers: Any) -> None:
    from kvwatch.cli import add_common

    p = subparsers.add_parser(
        "backtest",
        help="replay the pipeline over Prometheus history: per-target state timeline and incidents",
        description=(
            "Fetch [FROM - window, TO] once (one range query per signal and source), then evaluate every "
            "step in memory exactly as the service would have, including the alert lifecycle."
        ),
    )
    add_common(p)
    for action in p._actions:  # same flag, backtest meaning: the replay step, not the data resolution
        if "--step" in action.option_strings:
            action.help = ("evaluate every DUR (default: evaluation.interval); a multiple of --resolution, "
                           "e.g. 1m")
    p.add_argument("--resolution", metavar="DUR",
                   help="resolution of the range queries (evaluation.step), e.g. 30s")
    p.add_argument("--from", dest="start", metavar="T0", required=True, help="first instant (RFC 3339 or Unix s)")
    p.add_argument("--to", dest="end", metavar="T1", required=True, help="last instant (RFC 3339 or Unix s)")
    p.add_argument("--labels", metavar="FILE", help="expected modes per target (YAML/JSON) to score against")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with charts")
    p.add_argument(
        "--samples", metavar="FILE",
        help="also write the replayed history as CSV: job, instance, signal, ts (UTC), value; one row per sample",
    )
    p.set_defaults(func=_cmd_backtest)


def _cmd_backtest(args: argparse.Namespace) -> int:
    from kvwatch.cli import EXIT_OK, parse_at
    from kvwatch.core.promclient import PromClient
    from kvwatch.core.rules import load_ruleset
    from kvwatch.errors import ConfigError
    from kvwatch.tools.backtest.labels import load_labels
    from kvwatch.tools.backtest.render import to_json, to_text
    from kvwatch.tools.backtest.replay import run_backtest
    from kvwatch.tools.backtest.scoring import score

    # --step is the backtest step here; the data resolution is --resolution (evaluation.step)
    step_flag, args.step = args.step, args.resolution
    step_s = None
    if step_flag is not None:
        try:
            step_s = parse_duration(step_flag)
        except ValueError as exc:
            raise ConfigError(f"--step: {exc}") from None
    if args.html:
        try:
            import matplotlib  # noqa: F401  (checked before any work: the text report is never lost)
        except ImportError:
            raise ConfigError("--html needs matplotlib: pip install 'kvwatch[charts]'") from None
    from kvwatch.cli import settings_from_args

    settings = settings_from_args(args)
    rules = load_ruleset(settings.rules.paths)
    start, end = parse_at(args.start), parse_at(args.end)
    if end < start:
        raise ConfigError("--to: must not be before --from")
    labels = load_labels(Path(args.labels)) if args.labels else None
    client = PromClient.from_settings(settings.prometheus)
    result = run_backtest(client, settings, rules, start, end, step_s)
    if labels is not None:
        from dataclasses import replace

        result = replace(result, scores=score(result, labels))
    if args.html:
        from kvwatch.tools.backtest.html import write_html

        write_html(Path(args.html), result)
    if args.samples and result.history is not None:
        result.history.to_frame().to_csv(args.samples, index=False)
    sys.stdout.write(to_json(result) if args.format == "json" else to_text(result))
    return EXIT_OK
