"""Settings: file → environment → flags, validated at load, errors naming file and key path."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pydantic import ValidationError

from kvwatch.cli import settings_from_args
from kvwatch.config import Settings, load_settings
from kvwatch.errors import ConfigError

TOKEN = "xoxb-1234-SECRET-token"


def write(tmp_path: Path, text: str, name: str = "kvwatch.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def problems(exc: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return [str(p) for p in exc.value.problems]


def test_defaults_without_file_or_env() -> None:
    s = load_settings(None, environ={})
    assert s == Settings()
    assert s.prometheus.url == "http://localhost:9090"
    assert (s.evaluation.window, s.evaluation.step, s.evaluation.rate_window) == (1800.0, 30.0, 120.0)
    assert not s.slack.enabled


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    f = write(tmp_path, "evaluation:\n  window: 20m\n  step: 15s\nprometheus:\n  url: http://file:9090\n")
    env = {"KVWATCH_EVALUATION_WINDOW": "15m", "KVWATCH_PROMETHEUS_URL": "http://env:9090"}
    assert load_settings(f, environ={}).evaluation.window == 1200
    s = load_settings(f, environ=env)
    assert (s.evaluation.window, s.evaluation.step, s.prometheus.url) == (900, 15, "http://env:9090")
    s = load_settings(f, environ=env, overrides={"evaluation": {"window": "10m"}})
    assert (s.evaluation.window, s.evaluation.step, s.prometheus.url) == (600, 15, "http://env:9090")


def test_cli_flags_win_over_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = write(tmp_path, 'prometheus:\n  url: http://file:9090\ndiscovery:\n  selector: \'{ns="file"}\'\n')
    monkeypatch.setenv("KVWATCH_PROMETHEUS_URL", "http://env:9090")
    monkeypatch.setenv("KVWATCH_EVALUATION_STEP", "10s")
    args = argparse.Namespace(
        config=str(f), prometheus_url="http://flag:9090", selector='{ns="flag"}', window="8m", step=None,
        rules=["a.yaml", "b"],
    )
    s = settings_from_args(args)
    assert s.prometheus.url == "http://flag:9090"
    assert s.discovery.selector == '{ns="flag"}'
    assert (s.evaluation.window, s.evaluation.step) == (480, 10)
    assert s.rules.paths == ("a.yaml", "b")


def test_env_aliases_and_lists(tmp_path: Path) -> None:
    env = {
        "SLACK_BOT_TOKEN": TOKEN, "SLACK_CHANNEL": "#llm-oncall", "KVWATCH_STATE_PATH": "/var/lib/kvwatch.db",
        "KVWATCH_DISCOVERY_DIALECTS": "vllm-v1, sglang", "KVWATCH_PROMETHEUS_VERIFY_TLS": "false",
    }
    s = load_settings(None, environ=env)
    assert s.slack.bot_token is not None and s.slack.bot_token.get_secret_value() == TOKEN
    assert s.slack.enabled and s.slack.channel == "#llm-oncall"
    assert s.state.path == "/var/lib/kvwatch.db"
    assert s.discovery.dialects == ("vllm-v1", "sglang")
    assert s.prometheus.verify_tls is False
    assert TOKEN not in repr(s) and TOKEN not in str(s.model_dump())


def test_settings_are_frozen() -> None:
    s = load_settings(None, environ={})
    with pytest.raises(ValidationError):
        s.evaluation.window = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("yaml_text", "location", "fragment"),
    [
        ("evaluation:\n  windoww: 5m\n", "evaluation.windoww", "unknown key"),
        ("colour: red\n", "colour", "unknown key"),
        ("prometheus:\n  retries: many\n", "prometheus.retries", "'many'"),
        ("prometheus:\n  retries: 9\n", "prometheus.retries", "9"),
        ("server:\n  port: http\n", "server.port", "'http'"),
        ("evaluation:\n  window: 5 minutes\n", "evaluation.window", "expected a duration like 30s"),
        ("lifecycle:\n  hold_down: -5m\n", "lifecycle.hold_down", "'-5m'"),
        ("slack:\n  routes:\n    - {min_severity: info}\n", "slack.routes.0.channel", "required key is missing"),
        ("slack:\n  routes:\n    - {channel: x, min_severity: loud}\n", "slack.routes.0.min_severity", "'loud'"),
        ("evaluation:\n  window: 1m\n  step: 30s\n", "evaluation.window", "at least 4 x step"),
        ("discovery:\n  dialects: [vllm-v9]\n", "discovery.dialects", "'vllm-v9'"),
        ('discovery:\n  selector: \'{a="b\'\n', "discovery.selector", "does not close"),
        ("prometheus:\n  url: localhost:9090\n", "prometheus.url", "http(s) URL"),
    ],
)
def test_bad_values_name_file_and_key(tmp_path: Path, yaml_text: str, location: str, fragment: str) -> None:
    f = write(tmp_path, yaml_text)
    with pytest.raises(ConfigError) as exc:
        load_settings(f, environ={})
    hits = [p for p in problems(exc) if p.startswith(f"{f}: {location}")]
    assert hits, problems(exc)
    assert fragment in hits[0]


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    f = write(tmp_path, "evaluation:\n  window: soon\n  step: x\nprometheus:\n  retries: many\nnope: 1\n")
    with pytest.raises(ConfigError) as exc:
        load_settings(f, environ={})
    locs = {p.location for p in exc.value.problems}
    assert {"evaluation.window", "evaluation.step", "prometheus.retries", "nope"} <= locs


def test_invalid_yaml_names_file_and_line(tmp_path: Path) -> None:
    f = write(tmp_path, "prometheus:\n  url: http://x\n  timeout: [1s\nslack: {}\n")
    with pytest.raises(ConfigError) as exc:
        load_settings(f, environ={})
    (msg,) = problems(exc)
    assert msg.startswith(str(f)) and "line " in msg and "invalid YAML" in msg


@pytest.mark.parametrize(("text", "fragment"), [("- a\n- b\n", "expected a mapping"), ("", None)])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, fragment: str | None) -> None:
    f = write(tmp_path, text)
    if fragment is None:
        assert load_settings(f, environ={}) == Settings()  # an empty file is the defaults
        return
    with pytest.raises(ConfigError, match=fragment):
        load_settings(f, environ={})


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read"):
        load_settings(tmp_path / "nope.yaml", environ={})


def test_bad_environment_value_is_attributed_to_the_environment(tmp_path: Path) -> None:
    f = write(tmp_path, "evaluation:\n  step: 30s\n")
    with pytest.raises(ConfigError) as exc:
        load_settings(f, environ={"KVWATCH_EVALUATION_WINDOW": "soon"})
    (p,) = exc.value.problems
    assert (p.source, p.location) == ("environment", "evaluation.window")


@pytest.mark.parametrize(
    "yaml_text",
    [
        f"slack:\n  bot_token: [{TOKEN}]\n",
        f"slack:\n  webhook_url: {{url: {TOKEN}}}\n",
        f"prometheus:\n  headers:\n    Authorization: [Bearer {TOKEN}]\n",
    ],
)
def test_secrets_never_appear_in_errors(tmp_path: Path, yaml_text: str) -> None:
    f = write(tmp_path, yaml_text)
    with pytest.raises(ConfigError) as exc:
        load_settings(f, environ={})
    assert TOKEN not in str(exc.value)
    assert "<secret>" in str(exc.value)


def test_secret_from_env_not_leaked_by_unrelated_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(None, environ={"SLACK_BOT_TOKEN": TOKEN, "KVWATCH_SLACK_TIMEOUT": "later"})
    assert TOKEN not in str(exc.value) and "slack.timeout" in str(exc.value)


@pytest.mark.parametrize(("flag", "value"), [("window", "5 minutes"), ("step", "fast")])
def test_bad_duration_flag_names_the_flag(flag: str, value: str) -> None:
    args = argparse.Namespace(config=None, prometheus_url=None, selector=None, window=None, step=None, rules=None)
    setattr(args, flag, value)
    with pytest.raises(ConfigError, match=f"--{flag}"):
        settings_from_args(args)


def test_bad_selector_flag_names_the_flag() -> None:
    args = argparse.Namespace(config=None, prometheus_url=None, selector='{a="b', window=None, step=None, rules=None)
    with pytest.raises(ConfigError, match=r"^--selector"):
        settings_from_args(args)
