"""``kvwatch capacity``: KV-cache capacity math from flags or a ``config.json``.

With ``--prometheus-url`` the plan also uses the observed prompt/output length
quantiles and the pool size the engine reports (:mod:`kvwatch.tools.capacity.observed`).
Exit codes: 0 printed a plan; 2 bad input (one line on stderr, prefixed
``kvwatch capacity: ``); 3 Prometheus unreachable or erroring (names the URL).
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack, closing
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kvwatch.core.selector import parse_selector, render_matchers
from kvwatch.durations import format_duration, parse_duration, parse_time
from kvwatch.errors import ConfigError, PrometheusError
from kvwatch.tools.capacity.hfconfig import build_geometry
from kvwatch.tools.capacity.math import BudgetFor, RequestLimits, engine_budget, memory_budget
from kvwatch.tools.capacity.model import KVDtype, ModelGeometry
from kvwatch.tools.capacity.plan import CapacityPlan, plan_capacity
from kvwatch.tools.capacity.report import to_dict, to_text
from kvwatch.tools.capacity.units import (
    CapacityError,
    parse_fraction,
    parse_positive_int,
    parse_size,
    parse_tokens,
)

if TYPE_CHECKING:  # Prometheus modules load only when --prometheus-url is given
    from kvwatch.core.promclient import QueryClient
    from kvwatch.tools.capacity.observed import Observation

PROG = "kvwatch capacity"

EPILOG = """\
example (the article's worked numbers: 128 KiB/token, 4.25 GiB/request, 34 GiB for 8):
  kvwatch capacity --layers 32 --kv-heads 8 --head-dim 128 --kv-dtype bf16 \\
      --max-input 32k --max-output 2k --concurrency 8 --gpu-memory 80GiB --weights 16GiB
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``capacity`` on an ``add_subparsers()`` object; sets ``func=run``."""
    p = subparsers.add_parser(
        "capacity",
        help="KV-cache bytes per token/request and how many requests fit",
        description="KV bytes per token = 2 × layers × kv_heads × head_dim × bytes_per_element; "
        "worst-case request = (max input + max output) tokens.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("model (flags override --model-config)")
    g.add_argument("--model-config", metavar="config.json", help="Hugging Face config.json")
    g.add_argument("--layers", metavar="N", help="transformer layers (num_hidden_layers)")
    g.add_argument("--kv-heads", metavar="N", help="KV heads (num_key_value_heads; 1 = MQA)")
    g.add_argument("--head-dim", metavar="N", help="elements per head")
    dtypes = ", ".join(d.value for d in KVDtype)
    g.add_argument(
        "--kv-dtype",
        metavar="DTYPE",
        help=f"KV cache dtype: {dtypes} (default: torch_dtype or bf16)",
    )
    g = p.add_argument_group("admission limits (tokens accept 32k / 128K)")
    g.add_argument("--max-input", metavar="TOKENS", help="max prompt tokens per request")
    g.add_argument("--max-output", metavar="TOKENS", help="max output tokens per request")
    g.add_argument(
        "--concurrency", metavar="N", default="1", help="concurrent requests (default 1)"
    )
    g = p.add_argument_group("pool (sizes: 80GiB, 500MiB, 40GB, bytes)")
    g.add_argument("--gpu-memory", metavar="SIZE", help="memory per GPU")
    g.add_argument("--weights", metavar="SIZE", help="model weights, total over the GPUs")
    g.add_argument(
        "--gpu-utilization", metavar="F", default="0.9", help="usable fraction (default 0.9)"
    )
    g.add_argument("--num-gpus", metavar="N", default="1", help="tensor-parallel GPUs (default 1)")
    g = p.add_argument_group("observed traffic (engine histograms in Prometheus)")
    g.add_argument("--prometheus-url", metavar="URL", help="read length quantiles and pool size")
    g.add_argument("--at", metavar="T", help="RFC 3339 or Unix time (default: now)")
    g.add_argument("--window", metavar="DUR", help="rate window (default 1h)")
    g.add_argument("--selector", metavar="SEL", help="label matchers, e.g. '{model_name=\"m\"}'")
    g.add_argument("--config", metavar="FILE",
                   help="kvwatch config whose `prometheus` section (TLS, headers, timeout) applies")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    p.set_defaults(func=run)
    return p


def _int_or_none(value: str | None, field: str) -> int | None:
    return None if value is None else parse_positive_int(value, field)


def _tokens_or_none(value: str | None, field: str) -> int | None:
    return None if value is None else parse_tokens(value, field)


def _model(args: argparse.Namespace) -> ModelGeometry:
    return build_geometry(
        config_path=args.model_config,
        layers=_int_or_none(args.layers, "--layers"),
        kv_heads=_int_or_none(args.kv_heads, "--kv-heads"),
        head_dim=_int_or_none(args.head_dim, "--head-dim"),
        kv_dtype=None if args.kv_dtype is None else KVDtype.parse(args.kv_dtype),
    )


def _limits(args: argparse.Namespace, model: ModelGeometry) -> tuple[RequestLimits, list[str]]:
    """Limits from the flags; a missing max input/output fills the model's max context."""
    concurrency = parse_positive_int(args.concurrency, "--concurrency")
    max_in = _tokens_or_none(args.max_input, "--max-input")
    max_out = _tokens_or_none(args.max_output, "--max-output")
    ctx = model.max_context
    if max_in is not None and max_out is not None:
        notes = []
        if ctx is not None and max_in + max_out > ctx:
            notes.append(f"max input + max output exceed the model's max context {ctx:,} tokens")
        return RequestLimits(max_in, max_out, concurrency), notes
    if ctx is None:
        missing = "--max-input" if max_in is None else "--max-output"
        raise CapacityError(f"{missing}: required (no max_position_embeddings to default from)")
    if max_in is None:
        max_out = max_out or 0
        max_in = ctx - max_out
        if max_in <= 0:
            raise CapacityError(
                f"--max-output: {max_out:,} leaves no input within max context {ctx:,}"
            )
    else:
        max_out = ctx - max_in
        if max_out < 0:
            raise CapacityError(f"--max-input: {max_in:,} exceeds the model's max context {ctx:,}")
    note = (
        f"worst case = the model's max context {ctx:,} tokens (max_position_embeddings, "
        "vLLM's default max_model_len); pass --max-input/--max-output for your limits"
    )
    return RequestLimits(max_in, max_out, concurrency), [note]


def _memory_budget(args: argparse.Namespace) -> BudgetFor | None:
    utilization = parse_fraction(args.gpu_utilization, "--gpu-utilization")
    if args.gpu_memory is None and args.weights is None:
        return None
    if args.gpu_memory is None:
        raise CapacityError("--gpu-memory: required with --weights")
    if args.weights is None:
        raise CapacityError("--weights: required with --gpu-memory")
    return memory_budget(
        parse_size(args.gpu_memory, "--gpu-memory"),
        parse_size(args.weights, "--weights"),
        utilization=utilization,
    )


@dataclass(frozen=True)
class _Query:
    """Validated ``--prometheus-url/--at/--window/--selector``."""

    url: str
    at: datetime
    window: str
    matchers: str


def _query(args: argparse.Namespace) -> _Query | None:
    if args.prometheus_url is None:
        extra = next(
            (f for f in ("at", "window", "selector") if getattr(args, f) is not None), None
        )
        if extra:
            raise CapacityError(f"--{extra}: needs --prometheus-url")
        return None
    try:
        at = parse_time(args.at) if args.at else datetime.now(tz=UTC)
    except ValueError as exc:
        raise CapacityError(f"--at: {exc}") from None
    try:
        seconds = parse_duration(args.window or "1h")
    except ValueError as exc:
        raise CapacityError(f"--window: {exc}") from None
    if seconds < 1:
        raise CapacityError(f"--window: must be at least 1s, got {args.window!r}")
    try:
        matchers = render_matchers(parse_selector(args.selector))
    except ConfigError as exc:
        raise CapacityError(str(exc)) from None
    return _Query(args.prometheus_url, at, format_duration(seconds), matchers)


def _client(args: argparse.Namespace, url: str) -> QueryClient:
    """The Prometheus client of the ``prometheus`` section (file → environment), with the URL of
    ``--prometheus-url``: TLS, CA bundle, client certificate and headers apply as in ``once``."""
    from kvwatch.config import load_settings
    from kvwatch.core.promclient import PromClient

    try:
        settings = load_settings(getattr(args, "config", None), overrides={"prometheus": {"url": url}},
                                 flags={"prometheus.url": "--prometheus-url"})
    except ConfigError as exc:
        raise CapacityError(str(exc)) from None
    return PromClient.from_settings(settings.prometheus)


def build_plan(
    args: argparse.Namespace, client: QueryClient | None = None
) -> tuple[CapacityPlan, Observation | None]:
    """Validate the flags, read Prometheus if asked, compute the plan.

    Raises :class:`CapacityError` (bad input, before any query) or
    :class:`~kvwatch.errors.PrometheusError`. ``client`` replaces the
    :class:`~kvwatch.core.promclient.PromClient` built from ``--prometheus-url``.
    """
    model = _model(args)
    limits, notes = _limits(args, model)
    num_gpus = parse_positive_int(args.num_gpus, "--num-gpus")
    budget_for = _memory_budget(args)
    query = _query(args)
    if query is None:
        plan = plan_capacity(
            model, limits, num_gpus=num_gpus, budget_for=budget_for, notes=tuple(notes)
        )
        return plan, None
    from kvwatch.tools.capacity.observed import observe

    with ExitStack() as stack:
        active = client or stack.enter_context(closing(_client(args, query.url)))
        obs = observe(active, query.at, query.window, query.matchers, args.selector or "")
    notes += obs.notes
    if obs.pool_tokens:
        memory = budget_for(model, num_gpus) if budget_for else None
        if memory is not None:
            notes.append(
                f"--gpu-memory/--weights give a pool of {memory.tokens:,} tokens; "
                f"the engine reports {obs.pool_tokens:,} (used)"
            )
        budget_for = engine_budget(obs.pool_tokens, model, num_gpus, obs.pool_detail)
    observed = (obs.prompt, obs.output) if obs.prompt and obs.output else None
    plan = plan_capacity(
        model,
        limits,
        num_gpus=num_gpus,
        budget_for=budget_for,
        observed=observed,
        notes=tuple(notes),
    )
    return plan, obs


def run(args: argparse.Namespace) -> int:
    """Print the plan; return the exit code (0 ok, 2 bad input, 3 Prometheus failed)."""
    try:
        plan, obs = build_plan(args)
    except CapacityError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except PrometheusError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 3
    observed = obs.to_dict() if obs else None
    if args.format == "json":
        print(json.dumps(to_dict(plan, observed), indent=2))
    else:
        print(to_text(plan, observed))
    return 0
