"""Settings: a YAML file, then ``KVWATCH_*`` environment overrides, then CLI flags.

Validated into frozen pydantic models. Every problem is collected and reported
at once as ``file: key.path: got X, expected Y``. Secrets (Slack token, webhook
URL, Prometheus headers) are ``SecretStr`` and never appear in logs or reprs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)

from kvwatch.durations import format_duration, parse_duration, parse_time
from kvwatch.errors import ConfigError, Problem

#: points per series Prometheus returns from one range query at most (it refuses more)
MAX_POINTS = 11_000

Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PrometheusSettings(_Model):
    #: Prometheus base URL; `user:password@` in it is sent as basic auth and never shown
    url: str = "http://localhost:9090"
    timeout: Duration = 10.0
    retries: int = Field(1, ge=0, le=5)
    headers: dict[str, SecretStr] = {}
    verify_tls: bool = True
    #: PEM bundle of the CA(s) that sign Prometheus' certificate (instead of the system store)
    ca_file: str = ""
    #: client certificate (PEM) for mutual TLS (Prometheus / Thanos behind an mTLS proxy)
    cert_file: str = ""
    #: private key of the client certificate, when not in cert_file
    key_file: str = ""
    max_concurrency: int = Field(4, ge=1, le=32)
    #: extra parameters sent with every query, e.g. Thanos' max_source_resolution / partial_response
    query_params: dict[str, str] = {}
    #: link base for "open in Prometheus" buttons when the internal URL is not reachable by people
    external_url: str = ""


class DiscoverySettings(_Model):
    #: PromQL label matchers that scope every query, e.g. '{namespace="llm"}'
    selector: str = ""
    #: dialect ids to consider (default: all)
    dialects: tuple[str, ...] = ()
    #: `kvwatch run`: rediscover at least every N cycles; sooner when the count of live engines changes. The scrape interval and histogram bucket layouts are re-measured with each discovery
    refresh_cycles: int = Field(10, ge=1)
    #: regex (full match of the Triton `model` label) of the model holding the LLM; default: the models that export nv_trt_llm_* (LLM-API backend: tensorrt_llm)
    triton_model: str = ""


class EvaluationSettings(_Model):
    interval: Duration = 60.0
    window: Duration = 1800.0
    step: Duration = 30.0
    #: window of `rate()` over counters (preemptions, tokens, requests); widened to 4 scrape intervals measured from the data
    rate_window: Duration = 120.0
    #: window of TTFT/queue/ITL histogram quantiles: a p99 needs enough requests to be stable (also >= 4 scrape intervals)
    latency_window: Duration = 600.0
    #: TTFT SLO in seconds used by the misread rules (the tail must exceed it)
    ttft_slo: Duration = 2.0
    #: `kvwatch run`: keep the window in memory and fetch only the new steps each cycle
    incremental: bool = True
    # late samples (scrape duration, remote write, VictoriaMetrics' 30 s latency offset) can still change them
    #: `kvwatch run`: steps this close to the last cycle's instant are fetched again besides the new ones (cover late samples)
    overlap: Duration = 60.0


class RulesSettings(_Model):
    #: files or directories of kvwatch rule YAML; default: the bundled rules/kvwatch/
    paths: tuple[str, ...] = ()


class SlackRoute(_Model):
    channel: str
    min_severity: Literal["info", "warning", "critical"] = "warning"
    match: dict[str, str] = {}


class SlackSettings(_Model):
    bot_token: SecretStr | None = None
    channel: str = ""
    webhook_url: SecretStr | None = None
    api_url: str = "https://slack.com/api/"
    routes: tuple[SlackRoute, ...] = ()
    charts: bool = False
    timeout: Duration = 10.0

    @property
    def enabled(self) -> bool:
        return bool((self.bot_token and self.channel) or self.webhook_url)


class AlertmanagerSettings(_Model):
    urls: tuple[str, ...] = ()
    timeout: Duration = 10.0


class Silence(_Model):
    """Label matchers (all must equal) that mute notifications, optionally until an RFC 3339 time."""

    matchers: dict[str, str]
    comment: str = ""
    until: str = ""

    @field_validator("matchers")
    @classmethod
    def _some_matchers(cls, v: dict[str, str]) -> dict[str, str]:
        if not v:
            raise ValueError("at least one label matcher (an empty set would silence every alert)")
        return v

    @field_validator("until", mode="before")
    @classmethod
    def _until(cls, v: Any) -> Any:
        # an unquoted YAML timestamp arrives as a datetime (or a date): accept it as the time it spells
        if isinstance(v, datetime):
            return (v if v.tzinfo else v.replace(tzinfo=UTC)).isoformat()
        if isinstance(v, date):
            return datetime(v.year, v.month, v.day, tzinfo=UTC).isoformat()
        if isinstance(v, str) and v.strip():
            parse_time(v)  # ValueError names the expected form
        return v


class LifecycleSettings(_Model):
    #: a condition must hold this long before it fires (rules may set their own `for`)
    pending_for: Duration = 0.0
    #: clear for this long before an incident resolves (no flapping)
    hold_down: Duration = 300.0
    reminder_interval: Duration = 14400.0
    silences: tuple[Silence, ...] = ()
    #: a blind spot (state unknown) must persist this long before it becomes an incident
    blind_spot_for: Duration = 900.0
    #: a firing incident whose signals vanished is held open at once, but its thread says so only once they have stayed missing this long (a rollout's or a scrape hiccup's empty cycle says nothing)
    blind_notice_after: Duration = 120.0
    #: an open incident whose target is blind (present, no data) this long resolves as expired (0 = never); a target gone from scraping resolves after hold_down
    forget_after: Duration = 86400.0


class StateSettings(_Model):
    path: str = "kvwatch-state.db"


class ServerSettings(_Model):
    host: str = "0.0.0.0"
    port: int = Field(9877, ge=0, le=65535)


class ShardSettings(_Model):
    """This replica's share of the fleet (``kvwatch/core/shard.py``): targets with hashmod(job;instance) % count == index."""

    #: this replica's shard, 0 <= index < count (`--shard I/N`)
    index: int = Field(0, ge=0)
    #: number of shards; each target belongs to hashmod(job;instance) % count
    count: int = Field(1, ge=1)
    #: ``target`` hashes (job, instance) like Prometheus' hashmod; ``group`` hashes (job, model)
    by: Literal["target", "group"] = "target"


class HaSettings(_Model):
    """HA pair (``kvwatch/service/ha.py``): only the leader posts to Slack. Off while ``replica`` is empty."""

    #: this replica's id (unique in the group; the lowest live id leads), e.g. the pod name
    replica: str = ""
    #: matchers selecting the group's /metrics series in Prometheus
    selector: str = '{job="kvwatch"}'
    #: a replica whose heartbeat is older than this is hung (0: three intervals); a dead one goes stale sooner
    lease: Duration = 0.0


class LinkSettings(_Model):
    grafana_url: str = ""
    dashboard_uid: str = "kvwatch-instance"


class Settings(_Model):
    prometheus: PrometheusSettings = PrometheusSettings()
    discovery: DiscoverySettings = DiscoverySettings()
    evaluation: EvaluationSettings = EvaluationSettings()
    rules: RulesSettings = RulesSettings()
    slack: SlackSettings = SlackSettings()
    alertmanager: AlertmanagerSettings = AlertmanagerSettings()
    lifecycle: LifecycleSettings = LifecycleSettings()
    state: StateSettings = StateSettings()
    server: ServerSettings = ServerSettings()
    links: LinkSettings = LinkSettings()
    shard: ShardSettings = ShardSettings()
    ha: HaSettings = HaSettings()


#: Environment variables with fixed names (documented contract) → key path.
ENV_ALIASES: dict[str, tuple[str, ...]] = {
    "SLACK_BOT_TOKEN": ("slack", "bot_token"),
    "SLACK_CHANNEL": ("slack", "channel"),
    "SLACK_WEBHOOK_URL": ("slack", "webhook_url"),
    "KVWATCH_SLACK_API_URL": ("slack", "api_url"),
    "KVWATCH_STATE_PATH": ("state", "path"),
    "KVWATCH_PROMETHEUS_URL": ("prometheus", "url"),
    "KVWATCH_SELECTOR": ("discovery", "selector"),
}


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """``KVWATCH_<SECTION>_<KEY>`` for every key (string lists comma-separated), plus :data:`ENV_ALIASES`."""
    out: dict[str, Any] = {}
    for section, field in Settings.model_fields.items():
        sub = field.annotation
        for key, info in getattr(sub, "model_fields", {}).items():
            name = f"KVWATCH_{section}_{key}".upper()
            if name in environ:
                value: Any = environ[name]
                if info.annotation == tuple[str, ...]:  # lists of names/paths/URLs: comma-separated
                    value = tuple(v.strip() for v in value.split(",") if v.strip())
                out.setdefault(section, {})[key] = value
    for name, (section, key) in ENV_ALIASES.items():
        if environ.get(name):
            out.setdefault(section, {})[key] = environ[name]
    return out


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _deep_merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def _problems(source: str, exc: ValidationError) -> list[Problem]:
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        given = err.get("input")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "required key is missing"
        else:
            shown = "<secret>" if "token" in loc or "webhook" in loc or "headers" in loc else repr(given)
            expected = err["msg"].removeprefix("Value error, ").removeprefix("expected ").split("; got")[0].split(", got ")[0]
            expected = expected.removeprefix("Input should be ")  # pydantic's phrasing after "expected"
            msg = f"got {shown}, expected {expected}"
        out.append(Problem(source, loc, msg))
    return out


def read_yaml(path: Path) -> dict[str, Any]:
    """Parse a YAML mapping; errors name the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(Problem(str(path), "", f"cannot read: {exc.strerror}")) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(Problem(str(path), f"byte {exc.start}", "not UTF-8 text")) from None
    try:
        doc = yaml.safe_load(text)
    except (ValueError, TypeError, RecursionError) as exc:
        # PyYAML builds timestamps and numbers itself: `until: 2026-13-45` raises ValueError
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(Problem(str(path), "", f"invalid YAML value: {detail}")) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(Problem(str(path), where, f"invalid YAML: {problem}")) from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(Problem(str(path), "", f"expected a mapping at top level, got {type(doc).__name__}"))
    return doc


def load_settings(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    flags: Mapping[str, str] | None = None,
) -> Settings:
    """Build :class:`Settings` from file → env → overrides (CLI flags). Raises ConfigError.

    One validator for all three sources: every problem (type or semantic) is
    attributed to where its value came from, the file, ``environment``, or the flag
    named in ``flags`` (``{"evaluation.window": "--window"}``).
    """
    environ = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        data = read_yaml(Path(path))
    env = _env_overrides(environ)
    over = overrides or {}
    merged = _deep_merge(_deep_merge(data, env), over)
    origins: dict[tuple[str, ...], str] = {(s, k): "environment" for s, sub in env.items() for k in sub}
    for s, sub in over.items():
        for k in sub if isinstance(sub, Mapping) else ():
            origins[(s, k)] = (flags or {}).get(f"{s}.{k}", "flags")

    def attribute(p: Problem) -> Problem:
        origin = origins.get(tuple(p.location.split(".")[:2]))
        return Problem(origin, p.location, p.message) if origin else p

    try:
        settings = Settings.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError([attribute(p) for p in _problems(source, exc)]) from None
    try:
        _check_semantics(settings, source)
    except ConfigError as exc:
        raise ConfigError([attribute(p) for p in exc.problems]) from None
    return settings


def _check_semantics(s: Settings, source: str) -> None:
    from kvwatch.core.dialects import DIALECT_BY_ID
    from kvwatch.core.selector import parse_selector

    problems: list[Problem] = []
    ev = s.evaluation
    if ev.interval <= 0:
        problems.append(Problem(source, "evaluation.interval", f"got {ev.interval:g}s, expected > 0"))
    points = ev.window / ev.step + 1 if ev.step > 0 else 0
    if points > MAX_POINTS:
        problems.append(Problem(
            source, "evaluation.step",
            f"window {format_duration(ev.window)} at step {format_duration(ev.step)} is {points:,.0f} points per "
            f"series; Prometheus answers at most {MAX_POINTS:,}: use a step of at least "
            f"{format_duration(math.ceil(ev.window / (MAX_POINTS - 1)))} or a shorter window"))
    if ev.step <= 0:
        problems.append(Problem(source, "evaluation.step", f"got {ev.step:g}s, expected > 0"))
    elif ev.window < 4 * ev.step:
        problems.append(
            Problem(source, "evaluation.window", f"got {ev.window:g}s, expected at least 4 x step ({ev.step:g}s)")
        )
    if ev.rate_window <= 0:
        problems.append(Problem(source, "evaluation.rate_window", "got 0, expected > 0"))
    for d in s.discovery.dialects:
        if d not in DIALECT_BY_ID:
            problems.append(
                Problem(source, "discovery.dialects", f"got {d!r}, expected one of {', '.join(DIALECT_BY_ID)}")
            )
    if s.discovery.triton_model:
        import re

        try:
            re.compile(s.discovery.triton_model)
        except re.error as exc:
            problems.append(Problem(source, "discovery.triton_model", f"not a regular expression: {exc}"))
        if '"' in s.discovery.triton_model or "\\" in s.discovery.triton_model:
            problems.append(Problem(source, "discovery.triton_model", "quotes and backslashes are not supported"))
    for key, text in (("discovery.selector", s.discovery.selector), ("ha.selector", s.ha.selector)):
        try:
            parse_selector(text, f"{source}: {key}")
        except ConfigError as exc:
            problems.extend(exc.problems)
    if s.shard.index >= s.shard.count:
        problems.append(
            Problem(source, "shard.index", f"got {s.shard.index}, expected below shard.count ({s.shard.count})")
        )
    if not s.prometheus.url.startswith(("http://", "https://")):
        problems.append(Problem(source, "prometheus.url", f"got {s.prometheus.url!r}, expected an http(s) URL"))
    p = s.prometheus
    for key in ("ca_file", "cert_file", "key_file"):
        path = getattr(p, key)
        if path and not os.access(path, os.R_OK):
            problems.append(Problem(source, f"prometheus.{key}", f"cannot read {path!r}"))
    if p.key_file and not p.cert_file:
        problems.append(Problem(source, "prometheus.key_file", "set, but prometheus.cert_file is not"))
    if problems:
        raise ConfigError(problems)
