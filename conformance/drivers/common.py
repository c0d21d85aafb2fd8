"""Shared by the drivers (runs inside an engine venv: standard library + prometheus_client).

A timeline step (see conformance/timeline.py) carries ``state`` (gauges), ``delta``
(counter increments since the previous scrape) and ``obs`` (``[value, count]`` pairs per
quantity). ``expand`` turns pairs into the plain value lists the engines' stats objects
hold; ``finished`` pairs the per-request quantities into request records.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def load(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def expand(pairs: list[list[float]]) -> list[float]:
    out: list[float] = []
    for value, count in pairs:
        out.extend([float(value)] * int(count))
    return out


def finished(step: dict[str, Any]) -> list[dict[str, float]]:
    """One record per request finished in the interval (e2e observations), its other
    quantities paired in sorted order (only the marginals matter to histograms)."""
    obs = step["obs"]
    e2e = sorted(expand(obs["e2e"]))
    cols = {q: sorted(expand(obs[q])) for q in ("queue", "prompt_tokens", "gen_tokens",
                                               "tpot_req")}
    n = len(e2e)
    recs = []
    stop = round(step["delta"]["success_stop"])
    for i in range(n):
        rec = {"e2e": e2e[i], "reason": "stop" if i < stop else "length"}
        for q, vals in cols.items():
            rec[q] = vals[i] if i < len(vals) else (vals[-1] if vals else 0.0)
        recs.append(rec)
    return recs


def build(cls: type, values: dict[str, Any]) -> Any:
    """Instantiate dataclass ``cls`` from the ``values`` its fields name; required fields
    that ``values`` lacks get 0 (the stats classes change between versions)."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name in values:
            kwargs[f.name] = values[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = 0
    return cls(**kwargs)


class Writer:
    """JSON lines of scrapes."""

    def __init__(self, path: str) -> None:
        self._fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def scrape(self, t: float, text: bytes | str) -> None:
        body = text.decode("utf-8") if isinstance(text, bytes) else text
        self._fh.write(json.dumps({"t": t, "text": body}) + "\n")

    def close(self) -> None:
        self._fh.close()


def main_args() -> list[tuple[str, str]]:
    """``TIMELINE.json SCRAPES.jsonl`` pairs (several per process: the engine imports once)."""
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit(f"usage: {sys.argv[0]} TIMELINE.json SCRAPES.jsonl [TIMELINE.json SCRAPES.jsonl ...]")
    return list(zip(args[::2], args[1::2], strict=True))


def small_llama_dir(cfg: dict[str, Any], prefix: str) -> str:
    """A new directory (``prefix`` names it) holding only a small Llama ``config.json``
    whose context is ``max_model_len``: enough for an engine's model config, no weights,
    no tokenizer."""
    root = tempfile.mkdtemp(prefix=prefix)
    Path(root, "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
        "intermediate_size": 1024, "num_attention_heads": 8, "num_hidden_layers": 2,
        "num_key_value_heads": 8, "vocab_size": 32000, "torch_dtype": "float16",
        "max_position_embeddings": int(cfg["max_model_len"]), "rms_norm_eps": 1e-5,
    }))
    return root


def replay_each_forked(replay: Callable[[dict[str, Any], str], None], multiproc_dir: str) -> None:
    """Each ``TIMELINE.json SCRAPES.jsonl`` pair of the command line replayed in a forked
    child: a fresh registry per timeline, while the engine modules the parent imported are
    shared. ``multiproc_dir`` (``PROMETHEUS_MULTIPROC_DIR``) is emptied first so /metrics
    holds that timeline only. A failed replay prints its traceback and exits naming the
    timeline; the seconds each took go to stderr."""
    for tl_path, out_path in main_args():
        started = time.monotonic()
        for name in os.listdir(multiproc_dir):
            os.unlink(os.path.join(multiproc_dir, name))
        pid = os.fork()
        if pid == 0:
            try:
                replay(load(tl_path), out_path)
            except BaseException:
                import traceback

                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            sys.exit(f"{tl_path}: replay failed (status {status})")
        print(f"{tl_path}: {time.monotonic() - started:.1f}s", file=sys.stderr)
