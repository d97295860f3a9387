from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from devharness.adapters import make_adapter, peft_config, tensor_name, write_safetensors
from loraplane.lora import check_tensors, parse_lora_config, read_header
from loraplane.lora.safetensors import SafetensorsHeader
from loraplane.lora.tensors import layer_index
from tests.lora.util import expect_refusal

PREFIX = "base_model.model."


def _header(tmp_path: Path, shapes: dict[str, tuple[int, ...]]) -> SafetensorsHeader:
    tensors = {name: np.zeros(shape, dtype=np.float32) for name, shape in shapes.items()}
    return read_header(write_safetensors(tmp_path / "w.safetensors", tensors))


def _pair(path: str, rank: int = 8, in_f: int = 16, out_f: int = 32) -> dict[str, tuple[int, ...]]:
    return {
        f"{PREFIX}{path}.lora_A.weight": (rank, in_f),
        f"{PREFIX}{path}.lora_B.weight": (out_f, rank),
    }


def _config(**extra: Any) -> Any:
    return parse_lora_config(json.dumps(peft_config(extra=extra)).encode())


def test_summary_of_a_generated_adapter(tmp_path: Path) -> None:
    make_adapter(tmp_path, targets=("q_proj", "down_proj"), layers=3, kv_heads=2)
    header = read_header(tmp_path / "adapter_model.safetensors")
    summary = check_tensors(header, parse_lora_config(tmp_path / "adapter_config.json"))
    assert summary.rank == 8
    assert summary.target_modules == ("down_proj", "q_proj")
    assert summary.layers == (0, 1, 2)
    assert summary.dtypes == ("F32",)
    assert summary.features["model.layers.2.mlp.down_proj"] == (256, 128)
    module = summary.modules["model.layers.1.self_attn.q_proj"]
    assert (module.short_name, module.layer, module.rank) == ("q_proj", 1, 8)
    assert (module.in_features, module.out_features) == (128, 128)


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ({}, "no LoRA tensors"),
        ({f"{PREFIX}model.layers.0.self_attn.q_proj.lora_A.weight": (8, 16)}, "no lora_B"),
        ({f"{PREFIX}model.layers.0.self_attn.q_proj.lora_B.weight": (16, 8)}, "no lora_A"),
        (
            _pair("model.layers.0.self_attn.q_proj") | {f"{PREFIX}model.norm.weight": (16,)},
            "not a LoRA weight",
        ),
        (
            _pair("model.layers.0.self_attn.q_proj")
            | {f"{PREFIX}model.layers.0.self_attn.q_proj.lora_B.bias": (16,)},
            "not a LoRA weight",
        ),
        (
            _pair("model.layers.0.self_attn.q_proj")
            | {f"{PREFIX}model.layers.0.self_attn.q_proj.lora_magnitude_vector": (32,)},
            "not a LoRA weight",
        ),
        (
            {
                f"{PREFIX}model.embed_tokens.lora_embedding_A": (8, 100),
                f"{PREFIX}model.embed_tokens.lora_embedding_B": (16, 8),
            },
            "embedding LoRA",
        ),
        (
            {
                "model.layers.0.self_attn.q_proj.lora_A.weight": (8, 16),
                "model.layers.0.self_attn.q_proj.lora_B.weight": (32, 8),
            },
            "does not start with",
        ),
        (
            {f"{PREFIX}.lora_A.weight": (8, 16), f"{PREFIX}.lora_B.weight": (32, 8)},
            "malformed module path",
        ),
        (_pair("model.layers.0.self_attn.q_proj.lora_A.default"), "not matched by target_modules"),
        (_pair("model.layers.0.self_attn.k_proj"), "not matched by target_modules"),
        (_pair("model.layers.0.self_attn.xq_proj"), "not matched by target_modules"),
        (_pair("model.layers.0.self_attn.q_proj", rank=4), "rank 8"),
        (
            _pair("model.layers.0.self_attn.q_proj")
            | {f"{PREFIX}model.layers.0.self_attn.q_proj.lora_B.weight": (32, 4)},
            "rank 8",
        ),
        (
            {
                f"{PREFIX}model.layers.0.self_attn.q_proj.lora_A.weight": (8, 16, 1),
                f"{PREFIX}model.layers.0.self_attn.q_proj.lora_B.weight": (32, 8),
            },
            "matrix",
        ),
        (_pair("model.layers.0.self_attn.q_proj", in_f=0), "non-empty matrix"),
    ],
)
def test_mismatches(tmp_path: Path, shapes: dict[str, tuple[int, ...]], message: str) -> None:
    error = expect_refusal("tensor_mismatch", check_tensors, _header(tmp_path, shapes), _config())
    assert message in error.message


def test_config_without_weights_for_a_target_is_fine(tmp_path: Path) -> None:
    # PEFT itself trains only the listed targets that exist in the model.
    summary = check_tensors(_header(tmp_path, _pair("model.layers.0.self_attn.q_proj")), _config())
    assert summary.target_modules == ("q_proj",)


def test_rank_pattern_is_honoured(tmp_path: Path) -> None:
    make_adapter(tmp_path, targets=("q_proj", "v_proj"), rank=8, rank_pattern={"v_proj": 2})
    header = read_header(tmp_path / "adapter_model.safetensors")
    config = parse_lora_config(tmp_path / "adapter_config.json")
    summary = check_tensors(header, config)
    assert summary.modules["model.layers.0.self_attn.v_proj"].rank == 2
    assert summary.rank == 8
    without_pattern = _config(target_modules=["q_proj", "v_proj"])
    error = expect_refusal("tensor_mismatch", check_tensors, header, without_pattern)
    assert error.detail["module"] == "model.layers.0.self_attn.v_proj"


def test_regex_targets_use_full_match(tmp_path: Path) -> None:
    shapes = _pair("model.layers.0.self_attn.q_proj") | _pair("model.layers.1.self_attn.q_proj")
    header = _header(tmp_path, shapes)
    check_tensors(header, _config(target_modules=r"model\.layers\.\d+\.self_attn\.q_proj"))
    only_layer_0 = _config(target_modules=r"model\.layers\.0\.self_attn\.q_proj")
    assert (
        expect_refusal("tensor_mismatch", check_tensors, header, only_layer_0)
        .detail["module"]
        .startswith("model.layers.1.")
    )
    expect_refusal("tensor_mismatch", check_tensors, header, _config(target_modules="q_proj"))


def test_exclude_modules_and_layers_to_transform(tmp_path: Path) -> None:
    shapes = _pair("model.layers.0.self_attn.q_proj") | _pair("model.layers.3.self_attn.q_proj")
    header = _header(tmp_path, shapes)
    error = expect_refusal(
        "tensor_mismatch",
        check_tensors,
        header,
        _config(exclude_modules=["layers.3.self_attn.q_proj"]),
    )
    assert "exclude_modules" in error.message
    check_tensors(header, _config(layers_to_transform=[0, 3]))
    error = expect_refusal(
        "tensor_mismatch", check_tensors, header, _config(layers_to_transform=[0])
    )
    assert "layers_to_transform" in error.message
    check_tensors(header, _config(layers_to_transform=[3, 0], layers_pattern="layers"))


def test_layer_index() -> None:
    assert layer_index("model.layers.12.self_attn.q_proj") == 12
    assert layer_index("model.layers.1.mlp.experts.7.up_proj") == 1
    assert layer_index("model.norm") is None
    assert layer_index("transformer.h.3.attn.c_attn", ("h",)) == 3
    assert layer_index("model.layers.3.attn", ("blocks",)) is None
    assert tensor_name(0, "q_proj", "A") == f"{PREFIX}model.layers.0.self_attn.q_proj.lora_A.weight"
