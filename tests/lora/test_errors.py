from __future__ import annotations

import pickle

import pytest

from loraplane.lora import ERROR_CODES, TOO_LARGE_CODES, AdapterInvalid


def test_codes_are_the_documented_set() -> None:
    assert {
        "missing_config", "invalid_config", "base_model_mismatch", "missing_weights",
        "invalid_safetensors", "safetensors_header_too_large", "safetensors_size_mismatch",
        "tensor_mismatch", "invalid_dtype", "non_finite_values", "rank_too_large",
        "target_module_unknown", "shape_mismatch", "file_too_large", "unsafe_archive",
        "archive_too_large", "archive_expansion_ratio", "unknown_file", "invalid_archive",
    } == ERROR_CODES  # fmt: skip


@pytest.mark.parametrize("code", sorted(ERROR_CODES))
def test_too_large_only_for_size_limits(code: str) -> None:
    error = AdapterInvalid(code, "msg", {"k": 1})
    assert error.too_large is (code in TOO_LARGE_CODES)
    assert error.to_dict() == {"code": code, "message": "msg", "detail": {"k": 1}}


def test_size_limit_codes() -> None:
    expected = {"safetensors_header_too_large", "file_too_large", "archive_too_large",
                "archive_expansion_ratio"}
    assert expected == TOO_LARGE_CODES
    assert AdapterInvalid("rank_too_large", "r").too_large is False


def test_unknown_code_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown AdapterInvalid code"):
        AdapterInvalid("bad_code", "nope")


def test_round_trips_through_pickle() -> None:
    error = AdapterInvalid("tensor_mismatch", "names", {"tensor": "x"})
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.code, copy.message, copy.detail, copy.too_large) == (
        "tensor_mismatch", "names", {"tensor": "x"}, False,
    )  # fmt: skip
