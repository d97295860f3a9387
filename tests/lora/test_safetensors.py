from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from devharness.adapters import safetensors_bytes, to_bf16_bits, write_safetensors
from loraplane.lora import read_header, scan_finite
from tests.lora.util import expect_refusal


def _raw(tmp_path: Path, content: bytes) -> Path:
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    return path


def _entry(dtype: str, shape: Any, begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_reads_a_valid_file(tmp_path: Path) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones((4,), dtype=np.float16)
    path = write_safetensors(tmp_path / "m.safetensors", {"a": a, "b": b}, {"format": "pt"})
    header = read_header(path)
    assert header.metadata == {"format": "pt"}
    assert list(header.tensors) == ["a", "b"]
    info = header.tensors["a"]
    assert (info.dtype, info.shape, info.begin, info.end) == ("F32", (2, 3), 0, 24)
    assert (header.tensors["b"].begin, header.tensors["b"].end) == (24, 32)
    assert header.data_start + header.data_bytes == path.stat().st_size
    with path.open("rb") as f:
        f.seek(header.data_start + info.begin)
        assert np.frombuffer(f.read(info.nbytes), "<f4").tolist() == a.ravel().tolist()


def test_empty_and_zero_sized_tensors_are_valid(tmp_path: Path) -> None:
    assert read_header(_raw(tmp_path, safetensors_bytes({}))).tensors == {}
    header = {"z": _entry("F32", [0, 5], 0, 0), "x": _entry("F16", [2], 0, 4)}
    assert (
        read_header(_raw(tmp_path, safetensors_bytes(header, data=b"\0" * 4))).tensors["z"].numel
        == 0
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x05\0\0", "shorter than the 8-byte"),
        (safetensors_bytes(b"{"), "cannot hold"),
        (safetensors_bytes(b' {"a": 1}'), "must start with"),
        (safetensors_bytes(b'{"\xff": 1}'), "not valid UTF-8"),
        (safetensors_bytes(b'{"a": '), "not valid JSON"),
        (safetensors_bytes(b'{"__metadata__": {"x": NaN}}'), "non-standard constant"),
        (safetensors_bytes(b'{"__metadata__": {"x": 1}}'), "must be a string"),
        (safetensors_bytes(b'{"__metadata__": ["x"]}'), "object of strings"),
        (safetensors_bytes(b'{"a": 1}'), "exactly the fields"),
        (
            safetensors_bytes(b'{"": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}'),
            "empty name",
        ),
    ],
)
def test_malformed_headers(tmp_path: Path, content: bytes, message: str) -> None:
    error = expect_refusal("invalid_safetensors", read_header, _raw(tmp_path, content))
    assert message in error.message


def test_duplicate_json_keys(tmp_path: Path) -> None:
    entry = json.dumps(_entry("F32", [1], 0, 4))
    top = f'{{"a": {entry}, "a": {entry}}}'.encode()
    error = expect_refusal(
        "invalid_safetensors", read_header, _raw(tmp_path, safetensors_bytes(top, data=b"\0" * 4))
    )
    assert error.detail == {"key": "a"}
    nested = b'{"a": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}}'
    expect_refusal(
        "invalid_safetensors",
        read_header,
        _raw(tmp_path, safetensors_bytes(nested, data=b"\0" * 4)),
    )


def test_deeply_nested_json(tmp_path: Path) -> None:
    doc = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    expect_refusal("invalid_safetensors", read_header, _raw(tmp_path, safetensors_bytes(doc)))


@pytest.mark.parametrize(
    "entry",
    [
        _entry("F128", [1], 0, 4),
        _entry("F32", [-1], 0, 4),
        _entry("F32", [True], 0, 4),
        _entry("F32", [1.0], 0, 4),
        _entry("F32", "1", 0, 4),
        {"dtype": "F32", "shape": [1], "data_offsets": [0]},
        {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]},
        {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "extra": 1},
        _entry("F32", [2], 0, 4),  # 2 x F32 needs 8 bytes, not 4
        _entry("F4", [3], 0, 4),  # 12 bits is not a whole number of bytes
    ],
)
def test_bad_tensor_entries(tmp_path: Path, entry: dict[str, Any]) -> None:
    content = safetensors_bytes({"t": entry}, data=b"\0" * 4)
    assert (
        expect_refusal("invalid_safetensors", read_header, _raw(tmp_path, content)).detail["tensor"]
        == "t"
    )


def test_overlapping_offsets(tmp_path: Path) -> None:
    header = {"a": _entry("F32", [2], 0, 8), "b": _entry("F32", [2], 4, 12)}
    error = expect_refusal(
        "invalid_safetensors",
        read_header,
        _raw(tmp_path, safetensors_bytes(header, data=b"\0" * 12)),
    )
    assert "overlaps" in error.message and error.detail == {"tensor": "b", "other": "a"}


def test_gap_between_tensors(tmp_path: Path) -> None:
    header = {"a": _entry("F32", [1], 0, 4), "b": _entry("F32", [1], 8, 12)}
    expect_refusal(
        "invalid_safetensors",
        read_header,
        _raw(tmp_path, safetensors_bytes(header, data=b"\0" * 12)),
    )


def test_header_claims_more_bytes_than_the_file(tmp_path: Path) -> None:
    header = {"a": _entry("F32", [1000], 0, 4000)}
    error = expect_refusal(
        "safetensors_size_mismatch",
        read_header,
        _raw(tmp_path, safetensors_bytes(header, data=b"\0" * 100)),
    )
    assert error.detail == {"tensor": "a", "end": 4000, "data_bytes": 100}


def test_header_length_bigger_than_the_file(tmp_path: Path) -> None:
    content = safetensors_bytes(b'{"__metadata__": {}}', header_length=10_000)
    error = expect_refusal("safetensors_size_mismatch", read_header, _raw(tmp_path, content))
    assert error.too_large is False


def test_trailing_bytes_after_the_last_tensor(tmp_path: Path) -> None:
    content = safetensors_bytes({"a": _entry("F32", [1], 0, 4)}, data=b"\0" * 5)
    expect_refusal("safetensors_size_mismatch", read_header, _raw(tmp_path, content))


def test_header_over_the_limit_is_a_size_refusal(tmp_path: Path) -> None:
    metadata = {"__metadata__": {"pad": "x" * 5000}}
    error = expect_refusal(
        "safetensors_header_too_large",
        read_header,
        _raw(tmp_path, safetensors_bytes(metadata)),
        max_header_bytes=4096,
    )
    assert error.too_large is True and error.detail["max_header_bytes"] == 4096


def _bits_file(tmp_path: Path, dtype: str, bits: list[int], uint: str) -> Path:
    filler = np.zeros(100, dtype=uint)  # a clean first tensor the scan must pass
    values = np.array(bits, dtype=uint)
    return write_safetensors(
        tmp_path / "v.safetensors",
        {"first": filler, "second": values},
        dtypes={"first": dtype, "second": dtype},
    )


_BAD_VALUES = {
    # dtype: (uint type, finite extremes, {kind: bit pattern})
    "F16": (
        "<u2",
        [0x7BFF, 0xFBFF, 0x0001, 0x8000],
        {"nan": 0x7E00, "inf": 0x7C00, "-inf": 0xFC00},
    ),
    "BF16": (
        "<u2",
        [0x7F7F, 0xFF7F, 0x0001, 0x8000],
        {"nan": 0x7F81, "inf": 0x7F80, "-inf": 0xFF80},
    ),
    "F32": (
        "<u4",
        [0x7F7FFFFF, 0xFF7FFFFF, 1, 0x80000000],
        {"nan": 0xFFC00000, "inf": 0x7F800000, "-inf": 0xFF800000},
    ),
    "F64": (
        "<u8",
        [0x7FEFFFFFFFFFFFFF, 1, 0x8000000000000000],
        {"nan": 0x7FF0000000000001, "inf": 0x7FF0000000000000, "-inf": 0xFFF0000000000000},
    ),
}


@pytest.mark.parametrize("dtype", sorted(_BAD_VALUES))
@pytest.mark.parametrize("kind", ["nan", "inf", "-inf"])
def test_non_finite_values_are_found_across_chunks(tmp_path: Path, dtype: str, kind: str) -> None:
    uint, finite, bad = _BAD_VALUES[dtype]
    bits = finite * 10 + [bad[kind]] + finite
    path = _bits_file(tmp_path, dtype, bits, uint)
    error = expect_refusal(
        "non_finite_values", scan_finite, path, read_header(path), chunk_bytes=24
    )
    assert error.detail == {
        "tensor": "second",
        "dtype": dtype,
        "index": len(finite) * 10,
        "value": kind,
    }


@pytest.mark.parametrize("dtype", sorted(_BAD_VALUES))
def test_finite_extremes_pass(tmp_path: Path, dtype: str) -> None:
    uint, finite, _bad = _BAD_VALUES[dtype]
    path = _bits_file(tmp_path, dtype, finite * 50, uint)
    scan_finite(path, read_header(path), chunk_bytes=24)


def test_real_float_arrays(tmp_path: Path) -> None:
    values = np.linspace(-3, 3, 1000, dtype=np.float32)
    tensors: dict[str, npt.NDArray[Any]] = {
        "f16": values.astype(np.float16),
        "bf16": to_bf16_bits(values),
        "f64": values.astype(np.float64),
    }
    path = write_safetensors(tmp_path / "ok.safetensors", tensors, dtypes={"bf16": "BF16"})
    scan_finite(path, read_header(path), chunk_bytes=64)
    values[777] = np.nan
    tensors["bf16"] = to_bf16_bits(values)
    path = write_safetensors(tmp_path / "bad.safetensors", tensors, dtypes={"bf16": "BF16"})
    error = expect_refusal(
        "non_finite_values", scan_finite, path, read_header(path), chunk_bytes=64
    )
    assert (error.detail["tensor"], error.detail["index"]) == ("bf16", 777)


def test_non_float_dtype_is_refused_before_reading(tmp_path: Path) -> None:
    path = write_safetensors(
        tmp_path / "i.safetensors",
        {"w": np.zeros(4, np.float32), "idx": np.arange(3, dtype=np.int32)},
    )
    error = expect_refusal("invalid_dtype", scan_finite, path, read_header(path))
    assert error.detail["tensor"] == "idx" and error.detail["dtype"] == "I32"


def test_file_shrinking_after_the_header_check(tmp_path: Path) -> None:
    path = write_safetensors(tmp_path / "s.safetensors", {"w": np.zeros(1000, np.float32)})
    header = read_header(path)
    os.truncate(path, path.stat().st_size - 10)
    expect_refusal("safetensors_size_mismatch", scan_finite, path, header, chunk_bytes=256)


@pytest.mark.parametrize("shape", [[10**200], [10**200, 10**200], [2, 10**4000], [3, 0, 10**200]])
def test_astronomical_shapes_are_refused_not_crashed_on(tmp_path: Path, shape: list[int]) -> None:
    data = b"\0" * 4
    content = safetensors_bytes({"a": _entry("F32", shape, 0, 4)}, data=data)
    error = expect_refusal("invalid_safetensors", read_header, _raw(tmp_path, content))
    assert "a" in error.message


def test_a_small_file_is_scanned_without_chunk_sized_buffers(tmp_path: Path) -> None:
    # A small model's LoRA has tensors of a few KiB; the agent scans one on every swap.
    values = np.linspace(-1, 1, 256, dtype=np.float32)
    path = write_safetensors(tmp_path / "small.safetensors", {"a": values, "b": values})
    header = read_header(path)
    tracemalloc.start()
    try:
        scan_finite(path, header)  # the default chunk: 4 MiB
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, f"{peak} bytes allocated to scan {values.nbytes * 2} bytes"
