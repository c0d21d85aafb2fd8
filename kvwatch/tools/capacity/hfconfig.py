"""Read KV geometry from a Hugging Face ``config.json``; merge flag overrides.

- GQA/MQA: ``num_key_value_heads`` (``num_kv_heads``; Falcon/GPT-BigCode
  ``multi_query`` → 1); MHA falls back to ``num_attention_heads``.
- ``head_dim``, else ``hidden_size / num_attention_heads``.
- MLA: DeepSeek ``kv_lora_rank`` + ``qk_rope_head_dim``.
- Sliding window: ``sliding_window`` (ignored when ``use_sliding_window`` is
  false), layers counted from ``layer_types`` or ``sliding_window_pattern``.
- Multimodal wrappers: the text model is read from ``text_config`` (Gemma 3,
  Llama 4, Mistral 3, …), inheriting ``torch_dtype`` from the outer config.
- ``torch_dtype`` (or ``dtype``) is the default KV dtype; ``max_position_embeddings``
  the default max context (vLLM's default ``max_model_len``).

Every error is a one-line :class:`CapacityError` naming the file and key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvwatch.tools.capacity.model import KVDtype, ModelGeometry
from kvwatch.tools.capacity.units import CapacityError

#: ``torch_dtype`` spellings → KV dtype. fp32 checkpoints are served in 16 bit by
#: default (vLLM ``dtype=auto`` picks fp16), hence fp32 → fp16 with a note.
_TORCH_DTYPES: dict[str, KVDtype] = {
    "bfloat16": KVDtype.BF16,
    "bf16": KVDtype.BF16,
    "float16": KVDtype.FP16,
    "fp16": KVDtype.FP16,
    "half": KVDtype.FP16,
    "float32": KVDtype.FP16,
    "float": KVDtype.FP16,
    "fp32": KVDtype.FP16,
}

#: Class defaults that real ``config.json`` files omit (transformers config classes).
_MODEL_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 131072,
    },
}
_FP32_NAMES = frozenset({"float32", "float", "fp32"})
_TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
_KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "seq_length")


def _first(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | None:
    for key in keys:
        if cfg.get(key) is not None:
            return key, cfg[key]
    return None


def _positive(source: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CapacityError(f"{source}: key {key!r} must be a whole number > 0, got {value!r}")
    return value


def _required(cfg: Mapping[str, Any], source: str, keys: tuple[str, ...]) -> int:
    found = _first(cfg, keys)
    if found is None:
        raise CapacityError(f"{source}: missing key {keys[0]!r}")
    return _positive(source, *found)


def _text_config(cfg: Mapping[str, Any], source: str) -> tuple[dict[str, Any], list[str]]:
    """The decoder's own config (``cfg`` or a nested ``text_config``) with class defaults filled in."""
    out = dict(cfg)
    if _first(cfg, _LAYER_KEYS) is None:
        for key in _TEXT_CONFIG_KEYS:
            inner = cfg.get(key)
            if isinstance(inner, Mapping):
                out = dict(inner)
                for dtype_key in ("torch_dtype", "dtype"):
                    if dtype_key not in out and dtype_key in cfg:
                        out[dtype_key] = cfg[dtype_key]
                break
    defaults = _MODEL_TYPE_DEFAULTS.get(str(out.get("model_type")), {})
    applied = {k: v for k, v in defaults.items() if out.get(k) is None}
    if not applied:
        return out, []
    text = ", ".join(f"{k}={v}" for k, v in applied.items())
    return {**out, **applied}, [f"{source}: {out['model_type']} class defaults applied: {text}"]


def _dtype(cfg: Mapping[str, Any], source: str) -> tuple[KVDtype, list[str]]:
    found = _first(cfg, ("torch_dtype", "dtype"))
    if found is None:
        return KVDtype.BF16, [
            f"{source} names no torch_dtype; assumed bf16 KV (override with --kv-dtype)"
        ]
    key, value = found
    name = str(value).lower().removeprefix("torch.")
    dtype = _TORCH_DTYPES.get(name)
    if dtype is None:
        raise CapacityError(f"{source}: unsupported {key} {value!r} (pass --kv-dtype)")
    notes = []
    if name in _FP32_NAMES:
        notes.append(f"{source}: {key} {value} is served in 16 bit by default; assumed fp16 KV")
    return dtype, notes


def _kv_heads(cfg: Mapping[str, Any], source: str, heads: int) -> int:
    """KV heads: MQA flags first (Falcon/GPT-BigCode ``multi_query``), then GQA keys, else MHA."""
    if cfg.get("multi_query") is True and not cfg.get("new_decoder_architecture"):
        return 1
    keys = _KV_HEAD_KEYS if cfg.get("multi_query_attention") else _KV_HEAD_KEYS[:-1]
    found = _first(cfg, keys)
    return heads if found is None else _positive(source, *found)


def _sliding(cfg: Mapping[str, Any], layers: int) -> tuple[int | None, int | None]:
    window = cfg.get("sliding_window")
    if window is None or cfg.get("use_sliding_window") is False or isinstance(window, bool):
        return None, None
    if not isinstance(window, int) or window <= 0:
        return None, None
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        return window, sum(1 for t in layer_types if t == "sliding_attention")
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 1:
        return window, layers - layers // pattern  # every pattern-th layer is global
    return window, layers


def geometry_from_config(
    config: Mapping[str, Any], *, source: str = "config.json", kv_dtype: KVDtype | None = None
) -> ModelGeometry:
    """Build the geometry from a parsed Hugging Face ``config.json``.

    ``kv_dtype`` (e.g. from ``--kv-dtype``) wins over the config's ``torch_dtype``,
    which is then not read at all. Raises :class:`CapacityError` naming ``source``
    and the missing or bad key.
    """
    cfg, notes = _text_config(config, source)
    layers = _required(cfg, source, _LAYER_KEYS)
    if kv_dtype is None:
        kv_dtype, dtype_notes = _dtype(cfg, source)
        notes += dtype_notes
    window, sliding_layers = _sliding(cfg, layers)
    context = _first(cfg, _CONTEXT_KEYS)
    common: dict[str, Any] = {
        "max_context": None if context is None else _positive(source, *context),
        "layers": layers,
        "kv_dtype": kv_dtype,
        "sliding_window": window,
        "sliding_layers": sliding_layers,
        "source": source,
    }
    if cfg.get("kv_lora_rank") is not None:
        rank = _positive(source, "kv_lora_rank", cfg["kv_lora_rank"])
        rope = _required(cfg, source, ("qk_rope_head_dim",))
        return ModelGeometry(
            kv_heads=1,
            head_dim=rank + rope,
            kv_factor=1,
            kv_lora_rank=rank,
            qk_rope_head_dim=rope,
            notes=tuple(notes),
            **common,
        )
    heads = _required(cfg, source, _HEAD_KEYS)
    kv_heads = _kv_heads(cfg, source, heads)
    head = _first(cfg, ("head_dim", "kv_channels"))
    if head is not None:
        head_dim = _positive(source, *head)
    else:
        hidden = _required(cfg, source, _HIDDEN_KEYS)
        if hidden % heads:
            raise CapacityError(
                f"{source}: hidden_size {hidden} is not divisible by num_attention_heads {heads} (add 'head_dim')"
            )
        head_dim = hidden // heads
    return ModelGeometry(kv_heads=kv_heads, head_dim=head_dim, notes=tuple(notes), **common)


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a ``config.json``; unreadable or non-object JSON raises :class:`CapacityError`."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CapacityError(
            f"--model-config: cannot read {str(p)!r}: {exc.strerror or exc}"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CapacityError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CapacityError(f"{p}: expected a JSON object, got {type(data).__name__}")
    return data


def build_geometry(
    *,
    config_path: str | Path | None = None,
    layers: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    kv_dtype: KVDtype | None = None,
) -> ModelGeometry:
    """Geometry from an optional ``config.json`` with flag values overriding it.

    Without a config, ``layers``, ``kv_heads`` and ``head_dim`` are required;
    ``kv_dtype`` defaults to bf16 (with a note).
    """
    overrides = {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim}
    given = {k: v for k, v in overrides.items() if v is not None}
    if config_path is not None:
        geometry = geometry_from_config(
            load_config(config_path), source=str(config_path), kv_dtype=kv_dtype
        )
        if given:
            changed = ", ".join(f"{k}={v}" for k, v in given.items())
            note = f"flags override {geometry.source}: {changed}"
            geometry = replace(geometry, notes=(*geometry.notes, note), **given)
        return geometry
    for name, value in overrides.items():
        if value is None:
            raise CapacityError(
                f"--{name.replace('_', '-')}: required unless --model-config is given"
            )
    notes: tuple[str, ...] = ()
    if kv_dtype is None:
        kv_dtype, notes = KVDtype.BF16, ("no --kv-dtype given; assumed bf16",)
    return ModelGeometry(kv_dtype=kv_dtype, notes=notes, **given)
