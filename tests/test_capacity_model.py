"""KV geometry from Hugging Face config.json files: fixtures against hand-computed bytes per token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvwatch.tools.capacity import (
    CapacityError,
    KVDtype,
    ModelGeometry,
    build_geometry,
    geometry_from_config,
    kv_bytes_per_token,
    load_config,
)

CONFIGS = Path(__file__).parent / "fixtures" / "model_configs"


@pytest.mark.parametrize(
    ("name", "layers", "kv_heads", "head_dim", "expected"),
    [
        # 2 × 32 × 8 × (4096 / 32) × 2 B
        ("llama-3.1-8b.json", 32, 8, 128, 131_072),
        # 2 × 64 × 8 × (5120 / 40) × 2 B
        ("qwen2.5-32b.json", 64, 8, 128, 262_144),
        # MQA: 2 × 32 × 1 × (4544 / 71) × 2 B
        ("falcon-7b-mqa.json", 32, 1, 64, 8_192),
        # MLA: 27 × (512 + 64) × 2 B, no K/V doubling
        ("deepseek-v2-lite-mla.json", 27, 1, 576, 31_104),
        # 2 × 32 × 8 × 128 × 2 B, window only noted
        ("mistral-7b-v0.1-sliding.json", 32, 8, 128, 131_072),
        # nested text_config, gemma3_text default head_dim 256: 2 × 48 × 8 × 256 × 2 B
        ("gemma-3-12b-text-config.json", 48, 8, 256, 393_216),
    ],
)
def test_fixture_bytes_per_token(
    name: str, layers: int, kv_heads: int, head_dim: int, expected: int
) -> None:
    model = geometry_from_config(load_config(CONFIGS / name), source=name)
    assert (model.layers, model.kv_heads, model.head_dim) == (layers, kv_heads, head_dim)
    assert model.kv_dtype is KVDtype.BF16  # torch_dtype bfloat16 in every fixture
    assert kv_bytes_per_token(model) == expected


def test_mla_geometry_is_a_single_latent() -> None:
    model = geometry_from_config(load_config(CONFIGS / "deepseek-v2-lite-mla.json"))
    assert model.is_mla and model.kv_factor == 1
    assert (model.kv_lora_rank, model.qk_rope_head_dim) == (512, 64)


def test_sliding_window_is_recorded_unless_disabled() -> None:
    mistral = geometry_from_config(load_config(CONFIGS / "mistral-7b-v0.1-sliding.json"))
    assert (mistral.sliding_window, mistral.sliding_layers) == (4096, 32)
    qwen = geometry_from_config(load_config(CONFIGS / "qwen2.5-32b.json"))
    assert qwen.sliding_window is None  # use_sliding_window: false


def test_gemma3_text_config_defaults_and_sliding_pattern() -> None:
    model = geometry_from_config(load_config(CONFIGS / "gemma-3-12b-text-config.json"), source="g")
    assert (model.sliding_window, model.sliding_layers) == (1024, 40)  # 5 of every 6 layers
    assert any("gemma3_text class defaults applied: head_dim=256" in n for n in model.notes)


def test_layer_types_count_sliding_layers() -> None:
    cfg = _cfg(sliding_window=512, layer_types=["sliding_attention", "full_attention"] * 4)
    assert geometry_from_config(cfg).sliding_layers == 4


def _cfg(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "hidden_size": 512,
        "torch_dtype": "float16",
    }
    return {**base, **extra}


def test_mha_falls_back_to_attention_heads_and_hidden_size() -> None:
    model = geometry_from_config(_cfg())
    assert (model.kv_heads, model.head_dim, model.kv_dtype) == (8, 64, KVDtype.FP16)


def test_head_dim_key_wins_over_hidden_size() -> None:
    assert geometry_from_config(_cfg(head_dim=96, num_key_value_heads=2)).head_dim == 96


def test_gpt_bigcode_style_multi_query() -> None:
    cfg = {"n_layer": 40, "n_head": 48, "n_embd": 6144, "multi_query": True}
    model = geometry_from_config(cfg)
    assert (model.layers, model.kv_heads, model.head_dim) == (40, 1, 128)


def test_fp32_checkpoint_assumes_fp16_with_a_note() -> None:
    model = geometry_from_config(_cfg(torch_dtype="float32"))
    assert model.kv_dtype is KVDtype.FP16
    assert any("float32" in n for n in model.notes)


def test_kv_dtype_argument_skips_torch_dtype() -> None:
    model = geometry_from_config(_cfg(torch_dtype="complex64"), kv_dtype=KVDtype.FP8)
    assert model.kv_dtype is KVDtype.FP8


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"num_attention_heads": 8}, "config.json: missing key 'num_hidden_layers'"),
        ({"num_hidden_layers": 2}, "config.json: missing key 'num_attention_heads'"),
        (
            {"num_hidden_layers": 2, "num_attention_heads": 8},
            "config.json: missing key 'hidden_size'",
        ),
        (
            {"num_hidden_layers": "32", "num_attention_heads": 8},
            "config.json: key 'num_hidden_layers' must be a whole number > 0, got '32'",
        ),
        (
            {"num_hidden_layers": 2, "num_attention_heads": 7, "hidden_size": 100},
            "config.json: hidden_size 100 is not divisible by num_attention_heads 7 (add 'head_dim')",
        ),
        (
            {"kv_lora_rank": 512, "num_hidden_layers": 2},
            "config.json: missing key 'qk_rope_head_dim'",
        ),
        (
            _cfg(torch_dtype="complex64"),
            "config.json: unsupported torch_dtype 'complex64' (pass --kv-dtype)",
        ),
    ],
)
def test_config_errors_are_one_line_naming_the_key(cfg: dict[str, Any], message: str) -> None:
    with pytest.raises(CapacityError) as err:
        geometry_from_config(cfg)
    assert str(err.value) == message


def test_load_config_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(CapacityError, match=r"^--model-config: cannot read '.*nope.json'"):
        load_config(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CapacityError, match=r"bad.json: not valid JSON"):
        load_config(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(CapacityError, match=r"bad.json: expected a JSON object, got list"):
        load_config(bad)


def test_missing_key_from_a_file_names_that_file(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 4096}))
    with pytest.raises(CapacityError) as err:
        build_geometry(config_path=path)
    assert str(err.value) == f"{path}: missing key 'num_hidden_layers'"


def test_flags_override_config_values() -> None:
    model = build_geometry(
        config_path=CONFIGS / "llama-3.1-8b.json", layers=16, kv_dtype=KVDtype.FP8
    )
    assert (model.layers, model.kv_heads, model.kv_dtype) == (16, 8, KVDtype.FP8)
    assert kv_bytes_per_token(model) == 2 * 16 * 8 * 128
    assert any("flags override" in n and "layers=16" in n for n in model.notes)


def test_flags_alone_need_layers_heads_and_head_dim() -> None:
    with pytest.raises(
        CapacityError, match=r"^--head-dim: required unless --model-config is given$"
    ):
        build_geometry(layers=32, kv_heads=8)
    model = build_geometry(layers=32, kv_heads=8, head_dim=128)
    assert model.kv_dtype is KVDtype.BF16 and model.notes == ("no --kv-dtype given; assumed bf16",)


def test_geometry_rejects_non_positive_values() -> None:
    with pytest.raises(CapacityError, match=r"^--kv-heads: must be a whole number > 0, got 0$"):
        ModelGeometry(layers=32, kv_heads=0, head_dim=128)


@pytest.mark.parametrize(
    ("name", "context"),
    [
        ("llama-3.1-8b.json", 131_072),
        ("deepseek-v2-lite-mla.json", 163_840),
        ("mistral-7b-v0.1-sliding.json", 32_768),
        ("gemma-3-12b-text-config.json", 131_072),  # gemma3_text class default
        ("falcon-7b-mqa.json", None),
    ],
)
def test_max_context_from_max_position_embeddings(name: str, context: int | None) -> None:
    assert geometry_from_config(load_config(CONFIGS / name)).max_context == context
