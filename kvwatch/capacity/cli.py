"""``kvwatch capacity``: KV-cache capacity math from flags or a ``config.json``.

Exit codes: 0 printed a plan; 2 bad input (one line on stderr, prefixed
``kvwatch capacity: ``); 3 Prometheus unreachable or erroring.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvwatch.capacity.hfconfig import build_geometry
from kvwatch.capacity.math import RequestLimits, memory_budget
from kvwatch.capacity.model import KVDtype
from kvwatch.capacity.plan import CapacityPlan, plan_capacity
from kvwatch.capacity.report import to_dict, to_text
from kvwatch.capacity.units import (
    CapacityError,
    parse_fraction,
    parse_positive_int,
    parse_size,
    parse_tokens,
)

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
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    p.set_defaults(func=run)
    return p


def _tokens(args: argparse.Namespace, name: str) -> int:
    value = getattr(args, name.replace("-", "_"))
    if value is None:
        raise CapacityError(f"--{name}: required")
    return parse_tokens(value, f"--{name}")


def _int_or_none(value: str | None, field: str) -> int | None:
    return None if value is None else parse_positive_int(value, field)


def build_plan(args: argparse.Namespace) -> CapacityPlan:
    """Validate the parsed flags and compute the plan (raises :class:`CapacityError`)."""
    model = build_geometry(
        config_path=args.model_config,
        layers=_int_or_none(args.layers, "--layers"),
        kv_heads=_int_or_none(args.kv_heads, "--kv-heads"),
        head_dim=_int_or_none(args.head_dim, "--head-dim"),
        kv_dtype=None if args.kv_dtype is None else KVDtype.parse(args.kv_dtype),
    )
    limits = RequestLimits(
        max_input=_tokens(args, "max-input"),
        max_output=_tokens(args, "max-output"),
        concurrency=parse_positive_int(args.concurrency, "--concurrency"),
    )
    num_gpus = parse_positive_int(args.num_gpus, "--num-gpus")
    budget_for = None
    if args.gpu_memory is not None or args.weights is not None:
        if args.gpu_memory is None:
            raise CapacityError("--gpu-memory: required with --weights")
        if args.weights is None:
            raise CapacityError("--weights: required with --gpu-memory")
        budget_for = memory_budget(
            parse_size(args.gpu_memory, "--gpu-memory"),
            parse_size(args.weights, "--weights"),
            utilization=parse_fraction(args.gpu_utilization, "--gpu-utilization"),
        )
    return plan_capacity(model, limits, num_gpus=num_gpus, budget_for=budget_for)


def run(args: argparse.Namespace) -> int:
    """Print the plan; return the exit code (0 ok, 2 bad input)."""
    try:
        plan = build_plan(args)
    except CapacityError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(to_dict(plan), indent=2))
    else:
        print(to_text(plan))
    return 0
