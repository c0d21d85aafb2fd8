"""README.md stays true: the configuration table matches ``Settings``, links resolve,
and every command it shows parses with the real CLI.

Regenerate the configuration table after changing ``kvwatch/config.py``:
``python tests/test_deploy_readme.py --write``.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
START, END = "<!-- config-table:start -->", "<!-- config-table:end -->"

#: descriptions for keys that have no ``#:`` comment in kvwatch/config.py
DESCRIPTIONS: dict[str, str] = {
    "prometheus.url": "Prometheus base URL",
    "prometheus.timeout": "timeout of each query",
    "prometheus.retries": "retries of a failed query (0-5)",
    "prometheus.headers": "extra HTTP headers, e.g. `Authorization` (secret)",
    "prometheus.verify_tls": "verify the server certificate",
    "prometheus.max_concurrency": "parallel range queries (1-32)",
    "evaluation.interval": "time between evaluations (`kvwatch run`)",
    "evaluation.window": "span every diagnosis looks back over (at least 4 × step)",
    "evaluation.step": "resolution of the range queries",
    "evaluation.rate_window": "window of `rate()` over counters (preemptions, tokens, requests)",
    "slack.bot_token": "Slack bot token (`xoxb-…`, secret)",
    "slack.channel": "default channel for the bot token",
    "slack.webhook_url": "incoming-webhook URL instead of a bot token (secret)",
    "slack.api_url": "Slack Web API base URL",
    "slack.routes": "per-channel routes: `channel`, `min_severity`, label `match`",
    "slack.charts": "attach a KV-usage chart (needs the `charts` extra)",
    "slack.timeout": "timeout of each Slack call",
    "alertmanager.urls": "Alertmanager base URLs to push alerts to (`/api/v2/alerts`)",
    "alertmanager.timeout": "timeout of each Alertmanager call",
    "lifecycle.reminder_interval": "re-post an open incident this often",
    "lifecycle.silences": "silences: label `matchers`, `comment`, `until` (RFC 3339)",
    "state.path": "JSON state file (incidents, outbox, Slack threads; checksummed, written atomically; a corrupt one is moved aside)",
    "server.host": "listen address of `/metrics`, `/healthz`, `/readyz`",
    "server.port": "listen port",
    "links.grafana_url": "Grafana base URL for dashboard links in messages",
    "links.dashboard_uid": "uid of the per-instance dashboard",
}


def _comments() -> dict[str, str]:
    """``section.key`` → the ``#:`` comment right above the field in kvwatch/config.py."""
    from kvwatch import config

    src = Path(config.__file__).read_text().splitlines()
    classes = {f.annotation.__name__: s for s, f in config.Settings.model_fields.items()}
    out: dict[str, str] = {}
    section = ""
    for i, line in enumerate(src):
        m = re.match(r"class (\w+)\(", line)
        if m:
            section = classes.get(m.group(1), "")
        m = re.match(r"    (\w+): ", line)
        if section and m and i and src[i - 1].strip().startswith("#:"):
            out[f"{section}.{m.group(1)}"] = src[i - 1].strip()[2:].strip()
    return out


def _default(field: Any) -> str:
    from kvwatch.durations import format_duration, parse_duration

    value = field.default
    if any(getattr(m, "func", None) is parse_duration for m in field.metadata):
        return f"`{format_duration(value) if value else '0s'}`"
    if value is None or value == () or value == {}:
        return "—"
    if value == "":
        return '`""`'
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def config_table() -> str:
    """The Markdown table of every settings key: default, environment variable, meaning."""
    from kvwatch.config import ENV_ALIASES, Settings

    aliases = {f"{s}.{k}": name for name, (s, k) in ENV_ALIASES.items()}
    comments = _comments()
    rows = ["| key | default | environment | meaning |", "|---|---|---|---|"]
    for section, sf in Settings.model_fields.items():
        for key, f in sf.annotation.model_fields.items():
            path = f"{section}.{key}"
            scalar = not str(f.annotation).startswith(("tuple", "dict"))
            envs = [f"`KVWATCH_{section.upper()}_{key.upper()}`"] if scalar else []
            if path in aliases and f"`{aliases[path]}`" not in envs:
                envs.insert(0, f"`{aliases[path]}`")
            desc = comments.get(path) or DESCRIPTIONS.get(path, "")
            rows.append(f"| `{path}` | {_default(f)} | {', '.join(envs) or '— (file only)'} | {desc} |")
    return "\n".join(rows) + "\n"


def _section(text: str) -> str:
    assert START in text and END in text, "README lacks the config-table markers"
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def test_config_table_matches_settings() -> None:
    assert _section(README.read_text()) == config_table(), "run: python tests/test_deploy_readme.py --write"
    for row in config_table().splitlines()[2:]:
        assert row.rstrip(" |").split("|")[-1].strip(), f"no description: {row}"


def test_local_links_resolve() -> None:
    text = README.read_text()
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        assert (ROOT / target).exists(), f"README links to missing {target}"


def _commands() -> list[list[str]]:
    """Every ``kvwatch ...`` line inside the README's shell code blocks."""
    out = []
    for block in re.findall(r"```(?:sh|bash|console)\n(.*?)```", README.read_text(), re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip().removeprefix("$ ")
            for part in re.split(r"\s*(?:&&|\|)\s*", line.split(" #")[0]):
                if part.startswith("kvwatch "):
                    out.append(shlex.split(part)[1:])
    return out


def test_readme_commands_parse_with_the_real_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from kvwatch.cli import build_parser

    cmds = _commands()
    seen = {c[0] for c in cmds if c}
    assert {"demo", "once", "check", "capacity", "backtest", "run"} <= seen, seen
    for argv in cmds:
        if "--help" in argv or "-h" in argv or argv == ["--version"]:
            continue
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"README command `kvwatch {shlex.join(argv)}` does not parse: {capsys.readouterr().err}")
            raise AssertionError from exc
        assert callable(getattr(args, "func", None)), argv


def test_readme_mentions_every_failure_mode_and_exit_code() -> None:
    from kvwatch.core.models import FailureMode
    from kvwatch.core.rules import load_ruleset

    text = README.read_text()
    for mode in FailureMode:
        assert f"`{mode.value}`" in text, mode
    for rule in load_ruleset().rules:
        if rule.cause:
            assert rule.cause.replace("_", " ") in text or rule.cause in text, rule.cause
    for code in ("`0`", "`2`", "`3`"):
        assert code in text



def test_readme_rule_format_names_every_signal_a_rule_may_use() -> None:
    """The rule-format section lists the signal names `kvwatch check` accepts: a derived
    signal added for a rule but left out of it is one users cannot find."""
    from kvwatch.core.rules import SIGNAL_NAMES

    section = README.read_text().split("Signals\nare ", 1)[1].split("Little's-law", 1)[0]
    listed = set(re.findall(r"[a-z][a-z0-9_]+", section))
    assert sorted(SIGNAL_NAMES - listed) == []

if __name__ == "__main__":
    if "--write" in sys.argv:
        text = README.read_text()
        head, rest = text.split(START, 1)
        tail = rest.split(END, 1)[1]
        README.write_text(f"{head}{START}\n{config_table()}{END}{tail}")
        print(f"updated {README}")
    else:
        sys.stdout.write(config_table())
