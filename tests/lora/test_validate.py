from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from devharness.adapters import (
    ALL_MODULES,
    make_adapter,
    make_base_config,
    tensor_name,
    write_safetensors,
)
from loraplane.lora import ALLOWED_FILES, BaseModelShapes, validate_adapter_dir
from tests.lora.util import expect_refusal


@pytest.fixture
def shapes(tmp_path: Path) -> BaseModelShapes:
    return BaseModelShapes.from_hf_config(make_base_config(tmp_path / "base.json", kv_heads=2))


def test_good_adapter_passes_every_check(tmp_path: Path, shapes: BaseModelShapes) -> None:
    adapter = make_adapter(
        tmp_path / "a", rank=16, alpha=32, targets=ALL_MODULES, kv_heads=2, dtype="bfloat16"
    )
    summary = validate_adapter_dir(
        adapter, expected_base_model="tiny-llama/", max_rank=16, base_shapes=shapes
    )
    assert (summary.rank, summary.alpha, summary.base_model) == (16, 32, "tiny-llama")
    assert summary.target_modules == tuple(sorted(ALL_MODULES))
    assert summary.files == ALLOWED_FILES
    assert (summary.layers, summary.dtypes, summary.num_tensors) == ((0, 1), ("BF16",), 28)
    assert json.loads(json.dumps(summary.to_dict()))["target_modules"] == sorted(ALL_MODULES)


def test_zero_b_adapter_is_valid(tmp_path: Path, shapes: BaseModelShapes) -> None:
    validate_adapter_dir(make_adapter(tmp_path / "a", zero_b=True, kv_heads=2), base_shapes=shapes)


def test_missing_files(tmp_path: Path) -> None:
    adapter = make_adapter(tmp_path / "a")
    (adapter / "adapter_model.safetensors").unlink()
    expect_refusal("missing_weights", validate_adapter_dir, adapter)
    (adapter / "adapter_config.json").unlink()
    expect_refusal("missing_config", validate_adapter_dir, adapter)


@pytest.mark.parametrize("extra", ["notes.txt", "adapter_model.bin", "nested/", "link"])
def test_unknown_files(tmp_path: Path, extra: str) -> None:
    adapter = make_adapter(tmp_path / "a")
    if extra.endswith("/"):
        (adapter / extra).mkdir()
    elif extra == "link":
        (adapter / "adapter_config.json").rename(tmp_path / "real.json")
        os.symlink(tmp_path / "real.json", adapter / "adapter_config.json")
        extra = "adapter_config.json"
    else:
        (adapter / extra).write_bytes(b"\x80\x02}q\x00.")
    error = expect_refusal("unknown_file", validate_adapter_dir, adapter)
    assert error.detail["files"] == [extra]
    if extra == "adapter_model.bin":
        assert "pickle" in error.message


def test_invalid_config_end_to_end(tmp_path: Path) -> None:
    adapter = make_adapter(tmp_path / "a", extra_config={"use_dora": True})
    assert expect_refusal("invalid_config", validate_adapter_dir, adapter).detail == {
        "field": "use_dora"
    }


def test_oversized_config(tmp_path: Path) -> None:
    adapter = make_adapter(tmp_path / "a", extra_config={"notes": "x" * (1 << 20)})
    assert expect_refusal("file_too_large", validate_adapter_dir, adapter).too_large


def test_readme_of_save_pretrained_is_ignored(tmp_path: Path) -> None:
    adapter = make_adapter(tmp_path / "a")
    (adapter / "README.md").write_text("---\nlibrary_name: peft\n---\n")
    assert validate_adapter_dir(adapter).files == ALLOWED_FILES


def test_other_model_name_is_refused_without_shapes(tmp_path: Path) -> None:
    adapter = make_adapter(tmp_path / "a", base_model="other-org/other-model")
    validate_adapter_dir(adapter)
    error = expect_refusal(
        "base_model_mismatch", validate_adapter_dir, adapter, expected_base_model="tiny-llama"
    )
    assert error.detail == {
        "base_model": "other-org/other-model", "expected_base_model": "tiny-llama"
    }
    assert "--base-model other-org/other-model" in error.message
    assert "LORAPLANE_BASE_MODEL_CONFIGS" in error.message


@pytest.mark.parametrize("actual", [None, "/home/me/models/tiny", "./base", "C:\\m\\tiny",
                                    "~/tiny", "runs/x/base"])
def test_path_or_null_is_accepted_without_shapes(tmp_path: Path, actual: str | None) -> None:
    adapter = make_adapter(tmp_path / "a", base_model=actual)
    summary = validate_adapter_dir(adapter, expected_base_model="tiny-llama")
    assert summary.base_model == actual
    assert len(summary.warnings) == 1
    assert "without a shape check" in summary.warnings[0]


@pytest.mark.parametrize("actual", [None, "/home/me/models/tiny", "meta-llama/Other"])
def test_shapes_decide_when_known(
    tmp_path: Path, shapes: BaseModelShapes, actual: str | None
) -> None:
    adapter = make_adapter(tmp_path / "a", base_model=actual, kv_heads=2)
    summary = validate_adapter_dir(adapter, expected_base_model="tiny-llama", base_shapes=shapes)
    # A check that passed is a note, not a warning.
    assert summary.warnings == ()
    assert "were checked against 'tiny-llama' and fit" in summary.notes[0]
    named = make_adapter(tmp_path / "b", kv_heads=2)
    named_summary = validate_adapter_dir(named, expected_base_model="tiny-llama",
                                         base_shapes=shapes)
    assert (named_summary.warnings, named_summary.notes) == ((), ())


def test_other_shapes_are_refused_with_a_fix(tmp_path: Path, shapes: BaseModelShapes) -> None:
    adapter = make_adapter(tmp_path / "a", hidden=64, intermediate=128, kv_heads=2)
    error = expect_refusal("shape_mismatch", validate_adapter_dir, adapter,
                           expected_base_model="tiny-llama", base_shapes=shapes)
    assert "trained for another model than base model 'tiny-llama'" in error.message
    assert "push it to an adapter registered for the base model" in error.message


def test_rank_limits(tmp_path: Path) -> None:
    adapter = make_adapter(tmp_path / "a", rank=16)
    validate_adapter_dir(adapter, max_rank=16)
    assert expect_refusal("rank_too_large", validate_adapter_dir, adapter, max_rank=8).detail == {
        "rank": 16,
        "max_rank": 8,
    }
    patterned = make_adapter(tmp_path / "b", rank=8, rank_pattern={"v_proj": 32})
    assert validate_adapter_dir(patterned).rank == 32
    expect_refusal("rank_too_large", validate_adapter_dir, patterned, max_rank=16)


def test_non_float_weights_even_without_value_scan(tmp_path: Path) -> None:
    adapter = make_adapter(tmp_path / "a", targets=("q_proj",), layers=1)
    tensors = {
        tensor_name(0, "q_proj", "A"): np.zeros((8, 128), np.int32),
        tensor_name(0, "q_proj", "B"): np.zeros((128, 8), np.float32),
    }
    write_safetensors(adapter / "adapter_model.safetensors", tensors)
    error = expect_refusal("invalid_dtype", validate_adapter_dir, adapter, check_values=False)
    assert error.detail["dtype"] == "I32"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("inject", ["nan", "inf"])
def test_non_finite_values_end_to_end(tmp_path: Path, dtype: str, inject: Any) -> None:
    adapter = make_adapter(tmp_path / "a", dtype=dtype, inject=inject)
    error = expect_refusal("non_finite_values", validate_adapter_dir, adapter)
    assert error.detail["tensor"] == tensor_name(1, "v_proj", "B")
    assert error.detail["value"] == inject
    validate_adapter_dir(adapter, check_values=False)


def test_base_shape_checks_end_to_end(tmp_path: Path, shapes: BaseModelShapes) -> None:
    wrong_kv = make_adapter(tmp_path / "a", targets=("k_proj",), kv_heads=4)
    validate_adapter_dir(wrong_kv)  # nothing to compare against at upload time
    expect_refusal("shape_mismatch", validate_adapter_dir, wrong_kv, base_shapes=shapes)
    too_deep = make_adapter(tmp_path / "b", layers=5, kv_heads=2)
    expect_refusal("shape_mismatch", validate_adapter_dir, too_deep, base_shapes=shapes)
    stray = make_adapter(
        tmp_path / "c", targets=("q_proj",), layers=1, extra_config={"target_modules": ["c_attn"]}
    )
    prefix = "base_model.model.model.layers.0.self_attn.c_attn"
    arrays = {
        f"{prefix}.lora_A.weight": np.zeros((8, 128), np.float32),
        f"{prefix}.lora_B.weight": np.zeros((128, 8), np.float32),
    }
    write_safetensors(stray / "adapter_model.safetensors", arrays)
    validate_adapter_dir(stray)
    expect_refusal("target_module_unknown", validate_adapter_dir, stray, base_shapes=shapes)


def test_tensor_mismatch_end_to_end(tmp_path: Path) -> None:
    adapter = make_adapter(tmp_path / "a", extra_config={"r": 4})
    assert expect_refusal("tensor_mismatch", validate_adapter_dir, adapter).detail["rank"] == 4


def test_safetensors_errors_end_to_end(tmp_path: Path) -> None:
    adapter = make_adapter(tmp_path / "a")
    expect_refusal(
        "safetensors_header_too_large", validate_adapter_dir, adapter, max_header_bytes=64
    )
    weights = adapter / "adapter_model.safetensors"
    os.truncate(weights, weights.stat().st_size - 1)
    expect_refusal("safetensors_size_mismatch", validate_adapter_dir, adapter)
    weights.write_bytes(b"\x02\0\0\0\0\0\0\0[]")
    expect_refusal("invalid_safetensors", validate_adapter_dir, adapter)
