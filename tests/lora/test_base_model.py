from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from devharness.adapters import ALL_MODULES, make_adapter, make_base_config, write_safetensors
from loraplane.lora import (
    BaseModelShapes,
    UnsupportedBaseModel,
    check_against_base,
    check_tensors,
    parse_lora_config,
    read_header,
)
from loraplane.lora.tensors import TensorSummary
from tests.lora.util import expect_refusal


def _summary(directory: Path) -> TensorSummary:
    header = read_header(directory / "adapter_model.safetensors")
    return check_tensors(header, parse_lora_config(directory / "adapter_config.json"))


def test_shapes_from_a_llama_config(tmp_path: Path) -> None:
    shapes = BaseModelShapes.from_hf_config(make_base_config(tmp_path, kv_heads=2))
    assert shapes == BaseModelShapes("llama", 128, 256, 4, 2, 32, 2)
    assert shapes.module_features() == {
        "q_proj": (128, 128), "k_proj": (128, 64), "v_proj": (128, 64), "o_proj": (128, 128),
        "gate_proj": (128, 256), "up_proj": (128, 256), "down_proj": (256, 128),
    }  # fmt: skip
    assert shapes.module_path("k_proj", 3) == "model.layers.3.self_attn.k_proj"
    assert shapes.module_path("up_proj", 0) == "model.layers.0.mlp.up_proj"
    assert BaseModelShapes.from_hf_config(tmp_path / "config.json") == shapes


def test_explicit_head_dim_and_defaults() -> None:
    # Gemma-style: heads * head_dim differs from hidden_size.
    gemma = BaseModelShapes.from_hf_config(
        {"model_type": "gemma", "hidden_size": 96, "intermediate_size": 200,
         "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
         "num_hidden_layers": 2}
    )  # fmt: skip
    assert gemma.module_features()["q_proj"] == (96, 128)
    assert gemma.module_features()["o_proj"] == (128, 96)
    mistral = BaseModelShapes.from_hf_config(
        {"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128,
         "num_attention_heads": 8, "head_dim": None, "num_hidden_layers": 1}
    )  # fmt: skip
    assert (mistral.head_dim, mistral.num_key_value_heads) == (8, 8)


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "gpt2", "n_embd": 64},
        {"model_type": "llama", "hidden_size": 64},
        {"model_type": "llama", "hidden_size": 64, "intermediate_size": 8,
         "num_attention_heads": 5, "num_hidden_layers": 1},
        {"model_type": "llama", "hidden_size": "64", "intermediate_size": 8,
         "num_attention_heads": 4, "num_hidden_layers": 1},
    ],
)  # fmt: skip
def test_unsupported_base_configs(config: dict[str, object]) -> None:
    with pytest.raises(UnsupportedBaseModel):
        BaseModelShapes.from_hf_config(config)


def test_unreadable_base_config(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedBaseModel, match="cannot read"):
        BaseModelShapes.from_hf_config(tmp_path / "missing.json")
    (tmp_path / "config.json").write_text("{nope")
    with pytest.raises(UnsupportedBaseModel, match="not JSON"):
        BaseModelShapes.from_hf_config(tmp_path)


def test_matching_adapter_passes(tmp_path: Path) -> None:
    make_adapter(tmp_path / "a", targets=ALL_MODULES, kv_heads=2)
    shapes = BaseModelShapes.from_hf_config(make_base_config(tmp_path, kv_heads=2))
    check_against_base(_summary(tmp_path / "a"), shapes)


@pytest.mark.parametrize(
    ("adapter", "base", "detail"),
    [
        ({"hidden": 64}, {}, {"expected_in_features": 128}),
        ({"kv_heads": 4}, {"kv_heads": 2}, {"out_features": 128, "expected_out_features": 64}),
        ({"intermediate": 512, "targets": ("down_proj",)}, {}, {"in_features": 512}),
        ({"layers": 3}, {"layers": 2}, {"layer": 2, "num_hidden_layers": 2}),
    ],
)
def test_shape_mismatch(tmp_path: Path, adapter: dict[str, Any], base: dict[str, Any],
                        detail: dict[str, int]) -> None:  # fmt: skip
    make_adapter(tmp_path / "a", **adapter)
    shapes = BaseModelShapes.from_hf_config(make_base_config(tmp_path, **base))
    error = expect_refusal("shape_mismatch", check_against_base, _summary(tmp_path / "a"), shapes)
    assert detail.items() <= error.detail.items()


@pytest.mark.parametrize(
    ("module", "target"),
    [
        ("model.layers.0.self_attn.qkv_proj", "qkv_proj"),
        ("lm_head", "lm_head"),
        ("model.layers.0.mlp.q_proj", "q_proj"),
        ("model.layers.0.self_attn.extra.q_proj", "q_proj"),
        ("model.q_proj", "q_proj"),
    ],
)
def test_unknown_target_modules(tmp_path: Path, module: str, target: str) -> None:
    tensors = {
        f"base_model.model.{module}.lora_A.weight": np.zeros((8, 128), np.float32),
        f"base_model.model.{module}.lora_B.weight": np.zeros((128, 8), np.float32),
    }
    (tmp_path / "a").mkdir()
    write_safetensors(tmp_path / "a" / "adapter_model.safetensors", tensors)
    make_adapter(tmp_path / "cfg", targets=("q_proj",), extra_config={"target_modules": [target]})
    (tmp_path / "cfg" / "adapter_config.json").rename(tmp_path / "a" / "adapter_config.json")
    shapes = BaseModelShapes.from_hf_config(make_base_config(tmp_path))
    error = expect_refusal(
        "target_module_unknown", check_against_base, _summary(tmp_path / "a"), shapes
    )
    assert error.detail["module"] == module
