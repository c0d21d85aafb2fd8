"""``kvwatch run``: evaluate on a schedule, track incidents, notify, serve /metrics."""

from __future__ import annotations

import argparse
import logging
import sys

from kvwatch.config import Settings
from kvwatch.core.rules import RuleSet, load_ruleset

log = logging.getLogger("kvwatch.service")


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from kvwatch.cli import add_common, add_shard_flag

    p = subparsers.add_parser("run", help="run the service: scheduled evaluation, alerts, /metrics")
    add_common(p)
    add_shard_flag(p)
    p.add_argument("--interval", metavar="DUR", help="evaluation interval, e.g. 60s")
    p.add_argument("--state", metavar="FILE", help="state file (default: state.path)")
    p.add_argument("--listen", metavar="HOST:PORT", help="address of /metrics, /healthz, /readyz")
    p.add_argument("--dry-run", action="store_true", help="evaluate and log; send nothing, write no state")
    p.add_argument("--once", action="store_true", help="run one cycle and exit (0 ok, 3 Prometheus error)")
    p.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    p.set_defaults(func=_cmd_run)


def _load(args: argparse.Namespace) -> tuple[Settings, RuleSet]:
    """Config file → env → common flags → the flags of ``run`` (validated, errors name the flag)."""
    from kvwatch.cli import settings_from_args
    from kvwatch.errors import ConfigError

    s = settings_from_args(args)  # --interval included: validated like the file key
    if args.state:
        s = s.model_copy(update={"state": s.state.model_copy(update={"path": args.state})})
    if args.listen:
        host, _, port = args.listen.rpartition(":")
        if not port.isdigit() or int(port) > 65535:
            raise ConfigError(f"--listen: got {args.listen!r}, expected HOST:PORT")
        server = s.server.model_copy(update={"host": host or "0.0.0.0", "port": int(port)})
        s = s.model_copy(update={"server": server})
    return s, load_ruleset(s.rules.paths)


def _cmd_run(args: argparse.Namespace) -> int:
    from kvwatch.service.http import HttpServer
    from kvwatch.service.runner import Runner, RunOptions, build_service, wait_ready_age
    from kvwatch.service.selfmetrics import SelfMetrics

    logging.basicConfig(
        level=getattr(logging, args.log_level), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    # one line per cycle: the scheduler's job lines and the HTTP clients' retry lines repeat kvwatch's own
    for noisy in ("apscheduler", "slack_sdk", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    settings, rules = _load(args)
    metrics = SelfMetrics()
    opts = RunOptions(dry_run=args.dry_run, once=args.once)
    service = build_service(settings, rules, opts, metrics)
    if args.once:
        report = service.cycle()
        return 0 if report.ok else 3
    http = HttpServer(
        settings.server.host, settings.server.port, metrics.registry,
        ready=lambda: service.ready(wait_ready_age(service.settings)),
    ).start()
    log.info("kvwatch: serving /metrics on %s:%d; evaluating every %gs%s", settings.server.host, http.port,
             settings.evaluation.interval, " (dry-run)" if args.dry_run else "")
    runner = Runner(service, lambda: _load(args))
    runner.install_signals()
    try:
        return runner.run_forever()
    finally:
        http.stop()
