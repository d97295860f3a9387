from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devharness.adapters import peft_config, write_config
from loraplane.lora import parse_lora_config
from tests.lora.util import expect_refusal


def _bytes(**extra: Any) -> bytes:
    return json.dumps(peft_config(extra=extra)).encode()


def test_parses_a_peft_config(tmp_path: Path) -> None:
    path = write_config(tmp_path, peft_config(rank=16, alpha=32, targets=["v_proj", "q_proj"]))
    config = parse_lora_config(path)
    assert (config.r, config.lora_alpha, config.target_modules) == (16, 32, ("q_proj", "v_proj"))
    assert config.base_model_name_or_path == "tiny-llama"
    assert (config.bias, config.fan_in_fan_out, config.use_rslora) == ("none", False, False)
    assert config.modules_to_save == () and config.rank_pattern == {}
    assert config.task_type == "CAUSAL_LM"
    assert parse_lora_config(path.read_bytes()) == config


def test_regex_targets_and_patterns() -> None:
    config = parse_lora_config(
        _bytes(
            target_modules=r".*\.(q|v)_proj",
            rank_pattern={"v_proj": 4, r"layers\.1\.self_attn\.q_proj": 2},
            alpha_pattern={"v_proj": 8.0},
            use_rslora=True,
        )
    )
    assert config.target_modules == r".*\.(q|v)_proj"
    assert config.rank_for("model.layers.0.self_attn.v_proj") == 4
    assert config.rank_for("model.layers.1.self_attn.q_proj") == 2
    assert config.rank_for("model.layers.0.self_attn.q_proj") == 8
    # Keys match a dot-bounded suffix only, as in PEFT and vLLM.
    assert config.rank_for("model.layers.0.self_attn.xv_proj") == 8
    assert config.alpha_for("model.layers.0.self_attn.v_proj") == 8.0
    assert config.scaling_for("model.layers.0.self_attn.v_proj") == pytest.approx(8.0 / 2.0)
    assert config.max_rank == 8


def test_missing_file(tmp_path: Path) -> None:
    expect_refusal("missing_config", parse_lora_config, tmp_path / "adapter_config.json")


def test_oversized_config(tmp_path: Path) -> None:
    path = write_config(tmp_path, peft_config(extra={"pad": "x" * 2000}))
    error = expect_refusal("file_too_large", parse_lora_config, path, max_bytes=1000)
    assert error.too_large is True


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe", "not UTF-8"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"r": NaN}', "non-standard constant"),
        (_bytes(peft_type="LOHA"), "peft_type"),
        (
            json.dumps({k: v for k, v in peft_config().items() if k != "peft_type"}).encode(),
            "peft_type",
        ),
        (_bytes(r=0), "r must be a positive integer"),
        (_bytes(r=True), "r must be a positive integer"),
        (_bytes(r=8.0), "r must be a positive integer"),
        (_bytes(lora_alpha="16"), "lora_alpha"),
        (_bytes(lora_alpha=0), "lora_alpha"),
        (_bytes(target_modules=None), "target_modules is missing"),
        (_bytes(target_modules=[]), "non-empty list"),
        (_bytes(target_modules=["q_proj", 3]), "non-empty strings"),
        (_bytes(target_modules="all-linear"), "all-linear"),
        (_bytes(target_modules="(unclosed"), "not a valid regular expression"),
        (_bytes(rank_pattern={"q_proj": 0}), "rank_pattern"),
        (_bytes(rank_pattern=["q_proj"]), "rank_pattern must be an object"),
        (_bytes(alpha_pattern={"q_proj": "x"}), "alpha_pattern"),
        (_bytes(use_rslora="yes"), "use_rslora must be true or false"),
        (_bytes(base_model_name_or_path=5), "base_model_name_or_path must be a string"),
        (_bytes(layers_to_transform=[0, -1]), "layers_to_transform"),
        (_bytes(layers_pattern=[1]), "layers_pattern"),
    ],
)
def test_invalid_configs(content: bytes, message: str) -> None:
    assert message in expect_refusal("invalid_config", parse_lora_config, content).message


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"use_dora": True}, "use_dora"),
        ({"bias": "all"}, "bias"),
        ({"bias": "lora_only"}, "bias"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"lora_bias": True}, "lora_bias"),
        ({"layer_replication": [[0, 2]]}, "layer_replication"),
        ({"trainable_token_indices": [1, 2]}, "trainable_token_indices"),
        ({"target_parameters": ["experts.gate_up_proj"]}, "target_parameters"),
        ({"alora_invocation_tokens": [5]}, "alora_invocation_tokens"),
        ({"init_lora_weights": "pissa"}, "init_lora_weights"),
        ({"init_lora_weights": "loftq"}, "init_lora_weights"),
    ],
)
def test_features_vllm_cannot_serve(extra: dict[str, Any], field: str) -> None:
    error = expect_refusal("invalid_config", parse_lora_config, _bytes(**extra))
    assert error.detail == {"field": field}


def test_harmless_options_are_accepted() -> None:
    config = parse_lora_config(
        _bytes(
            init_lora_weights="gaussian",
            modules_to_save=[],
            use_dora=None,
            exclude_modules=["k_proj"],
        )
    )
    assert config.exclude_modules == ("k_proj",)
