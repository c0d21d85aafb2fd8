"""The ``kvwatch`` command line.

Exit codes (a contract other tools rely on): 0 evaluated, 2 bad usage or
configuration (one line naming the file and key), 3 Prometheus unreachable or
erroring (the message names the URL).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kvwatch import __version__
from kvwatch.config import Settings, load_settings
from kvwatch.durations import parse_time
from kvwatch.errors import ConfigError, KvwatchError, PrometheusError

EXIT_OK, EXIT_USAGE, EXIT_PROMETHEUS = 0, 2, 3

#: sub-command modules; each exposes ``add_parser(subparsers)`` which sets ``func``
COMMAND_MODULES = (
    "kvwatch.service.cli",
    "kvwatch.demo",
    "kvwatch.sim.cli",
    "kvwatch.tools.capacity.cli",
    "kvwatch.tools.backtest.cli",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits 2 too; keep the one-line form
        self.exit(EXIT_USAGE, f"kvwatch: {message}\n")


def add_common(p: argparse.ArgumentParser, *, prometheus: bool = True) -> None:
    """Flags shared by every command that reads Prometheus."""
    p.add_argument("--config", metavar="FILE", help="YAML config file (default: built-in defaults + env)")
    p.add_argument("--rules", metavar="PATH", action="append", help="rule file or directory (repeatable)")
    if prometheus:
        p.add_argument("--prometheus-url", metavar="URL", help="Prometheus base URL")
        p.add_argument("--selector", metavar="SELECTOR", help='PromQL label matchers, e.g. \'{namespace="llm"}\'')
        p.add_argument("--window", metavar="DUR", help="evaluation window, e.g. 30m")
        p.add_argument("--step", metavar="DUR", help="resolution of range queries, e.g. 30s")


def add_shard_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shard", metavar="I/N", help="evaluate only shard I of N (hashmod of job;instance), e.g. 0/2")


#: flags that set a config key: (argparse dest, section.key, flag); commands define the ones they take
FLAG_KEYS = (
    ("prometheus_url", "prometheus.url", "--prometheus-url"),
    ("selector", "discovery.selector", "--selector"),
    ("window", "evaluation.window", "--window"),
    ("step", "evaluation.step", "--step"),
    ("interval", "evaluation.interval", "--interval"),
)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """File → env → flags, through one validator (errors name the flag, the variable or the file key)."""
    over: dict[str, dict[str, Any]] = {}
    flags: dict[str, str] = {}
    if getattr(args, "selector", None) is not None:
        from kvwatch.core.selector import parse_selector

        parse_selector(args.selector, "--selector")  # a bad flag is named as the flag, not as a file key
    for dest, key, flag in FLAG_KEYS:
        val = getattr(args, dest, None)
        if val is not None and (val != "" or dest == "selector"):
            section, name = key.split(".")
            over.setdefault(section, {})[name] = val
            flags[key] = flag
    if getattr(args, "rules", None):
        over.setdefault("rules", {})["paths"] = tuple(args.rules)
    if getattr(args, "shard", None):
        from kvwatch.core.shard import parse_shard

        try:
            shard = parse_shard(args.shard)
        except ValueError as exc:
            raise ConfigError(f"--shard: {exc}") from None
        over["shard"] = {"index": shard.index, "count": shard.count}
    settings = load_settings(args.config, overrides=over, flags=flags)
    from kvwatch.redact import install

    install(settings)  # before any client logs: secrets masked on every log handler from here on
    return settings


def parse_at(text: str | None) -> datetime:
    if not text:
        return datetime.now(tz=UTC)
    try:
        return parse_time(text)
    except ValueError as exc:
        raise ConfigError(f"--at: {exc}") from None


def _cmd_once(args: argparse.Namespace) -> int:
    from kvwatch.core.promclient import PromClient
    from kvwatch.core.report import to_json, to_text
    from kvwatch.core.rules import load_ruleset

    settings = settings_from_args(args)
    rules = load_ruleset(settings.rules.paths)
    at = parse_at(args.at)
    if getattr(args, "notify", False):
        settings = _notify_state(args, settings)
    client = PromClient.from_settings(settings.prometheus)
    from kvwatch.core.pipeline import evaluate

    evaluation = evaluate(client, settings, rules, at)
    if getattr(args, "notify", False):
        from kvwatch.service.once import notify_once

        notify_once(settings, evaluation)
    out = to_json(evaluation) if args.format == "json" else to_text(evaluation, verbose=not args.brief)
    sys.stdout.write(out)
    return EXIT_OK


def _notify_state(args: argparse.Namespace, settings: Any) -> Any:
    """``once --notify``: ``--state`` wins; with ``--at`` a state path must be explicit.

    An evaluation of the past must not write into the live service's state file nor page
    about the past through it (replays and tests give their own file)."""
    if args.state:
        return settings.model_copy(update={"state": settings.state.model_copy(update={"path": args.state})})
    if args.at and not os.environ.get("KVWATCH_STATE_PATH"):
        raise ConfigError("once --at --notify: give an explicit state file (--state FILE or KVWATCH_STATE_PATH); "
                          "refusing to write the live state file and page about the past")
    return settings


def _cmd_explain(args: argparse.Namespace) -> int:
    import json

    from kvwatch.core.explain import explain_json, explain_text
    from kvwatch.core.pipeline import evaluate
    from kvwatch.core.promclient import PromClient
    from kvwatch.core.report import _finite
    from kvwatch.core.rules import load_ruleset

    settings = settings_from_args(args)
    rules = load_ruleset(settings.rules.paths)
    client = PromClient.from_settings(settings.prometheus)
    evaluation = evaluate(client, settings, rules, parse_at(args.at), explain=args.target)
    chosen = [r for r in evaluation.results if r.checks and r.checks[0].conditions]
    if not chosen:
        known = ", ".join(str(r.target.key) for r in evaluation.results[:10]) or "none"
        raise ConfigError(f"explain: no discovered target matches {args.target!r} (targets: {known})")
    if args.format == "json":
        doc = [explain_json(r) for r in chosen]
        sys.stdout.write(json.dumps(_finite(doc), indent=2, allow_nan=False, default=str) + "\n")
    else:
        sys.stdout.write("\n".join(explain_text(r, evaluation) for r in chosen))
    return EXIT_OK


def _cmd_check(args: argparse.Namespace) -> int:
    from kvwatch.core.rules import load_ruleset

    settings = settings_from_args(args)
    rules = load_ruleset(settings.rules.paths)
    print(f"config ok ({args.config or 'defaults'}); {len(rules.rules)} rules from {len(rules.sources)} file(s)")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvwatch", description="Diagnose KV-cache failure modes of LLM inference engines.")
    parser.add_argument("--version", action="version", version=f"kvwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    once = sub.add_parser("once", help="evaluate every discovered target once and print the result")
    add_common(once)
    once.add_argument("--at", metavar="RFC3339", help="evaluation instant (default: now)")
    add_shard_flag(once)
    once.add_argument("--format", choices=("json", "text"), default="text")
    once.add_argument("--brief", action="store_true", help="text: one line per healthy target, first triage step only")
    once.add_argument("--notify", action="store_true", help="send notifications through the alert lifecycle")
    once.add_argument("--state", metavar="FILE",
                      help="--notify: state file (default: state.path; required with --at unless KVWATCH_STATE_PATH)")
    once.set_defaults(func=_cmd_once)
    explain = sub.add_parser(
        "explain", help="every rule and condition for one target: observed, threshold, outcome, near misses"
    )
    explain.add_argument("target", metavar="TARGET", help="job/instance or instance (or a part of one)")
    add_common(explain)
    explain.add_argument("--at", metavar="RFC3339", help="evaluation instant (default: now)")
    explain.add_argument("--format", choices=("json", "text"), default="text")
    explain.set_defaults(func=_cmd_explain)
    check = sub.add_parser("check", help="validate config and rules; exit 0 or 2")
    add_common(check, prometheus=False)
    check.set_defaults(func=_cmd_check)
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # optional command not built into this install
            raise
        mod.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        for p in exc.problems:
            print(f"kvwatch: {p}", file=sys.stderr)
        return EXIT_USAGE
    except PrometheusError as exc:
        print(f"kvwatch: {exc}", file=sys.stderr)
        return EXIT_PROMETHEUS
    except KvwatchError as exc:
        print(f"kvwatch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
