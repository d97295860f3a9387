"""``SafetensorsStream`` (bytes checked as they go by) gives the same answer as the reader
of a file on disk, however the bytes are cut into pieces."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from devharness.adapters import safetensors_bytes, to_bf16_bits, write_safetensors
from loraplane.lora.errors import AdapterInvalid
from loraplane.lora.safetensors import FLOAT_BITS, SafetensorsHeader, read_header, scan_finite
from loraplane.lora.safetensors_stream import SafetensorsStream

MAX_HEADER = 4096


def _tensors(poison: tuple[str, int, float] | None = None) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    tensors: dict[str, Any] = {
        "a": rng.standard_normal(7, dtype=np.float32),
        "b": rng.standard_normal((3, 5)).astype(np.float16),
        "c": to_bf16_bits(rng.standard_normal(9, dtype=np.float32)).view(np.uint16),
        "d": rng.standard_normal(4),  # float64
        "e": np.arange(6, dtype=np.int32),  # not scanned: refused by its dtype elsewhere
    }
    if poison is not None:
        name, index, value = poison
        flat = tensors[name].reshape(-1)
        flat[index] = to_bf16_bits(np.array([value], np.float32))[0] if name == "c" else value
    return tensors


def _file(tmp_path: Path, poison: tuple[str, int, float] | None = None) -> bytes:
    tensors = _tensors(poison)
    path = write_safetensors(tmp_path / "m.safetensors", tensors, {"format": "pt"},
                             dtypes={"c": "BF16"})
    return path.read_bytes()


def _on_disk(tmp_path: Path, content: bytes) -> tuple[str, Any]:
    path = tmp_path / "disk.safetensors"
    path.write_bytes(content)
    return _outcome(lambda: read_header(path, max_header_bytes=MAX_HEADER),
                    lambda header: scan_finite(path, _floats(header)))


def _streamed(content: bytes, pieces: Iterator[int]) -> tuple[str, Any]:
    stream = SafetensorsStream(max_header_bytes=MAX_HEADER)
    position = 0
    while position < len(content):
        step = next(pieces)
        stream.feed(content[position:position + step])
        position += step
    assert stream.size == len(content)
    return _outcome(stream.header, stream.raise_scan_error)


def _floats(header: SafetensorsHeader) -> SafetensorsHeader:
    kept = {k: v for k, v in header.tensors.items() if v.dtype in FLOAT_BITS}
    return SafetensorsHeader(kept, header.metadata, header.data_start)


def _outcome(header_of: Callable[[], SafetensorsHeader],
             scan: Callable[[SafetensorsHeader], None]) -> tuple[str, Any]:
    try:
        header = header_of()
        scan(header)
    except AdapterInvalid as exc:
        return exc.code, exc.detail
    return "ok", {k: (v.dtype, v.shape, v.begin, v.end) for k, v in header.tensors.items()}


def _pieces(kind: str) -> Iterator[int]:
    rng = random.Random(kind)
    while True:
        yield {"1": 1, "3": 3, "7": 7, "random": rng.randint(1, 40), "all": 1 << 30}[kind]


def _cases(tmp_path: Path) -> dict[str, bytes]:
    good = _file(tmp_path)
    cases = {"valid": good, "one byte short": good[:-1], "one byte extra": good + b"\0",
             "empty": b"", "five bytes": good[:5], "inside the header": good[:20],
             "header longer than the file": safetensors_bytes(b"{}", header_length=99),
             "header over the limit": safetensors_bytes(b"{}", header_length=MAX_HEADER + 1,
                                                        data=b" " * MAX_HEADER),
             "header length 1": safetensors_bytes(b"{", header_length=1),
             "not json": safetensors_bytes(b'{"a": '),
             "gap": safetensors_bytes({"a": {"dtype": "F32", "shape": [1],
                                             "data_offsets": [4, 8]}}, data=b"\0" * 8)}
    for name, index, value in [("a", 0, np.nan), ("a", 6, np.inf), ("b", 7, -np.inf),
                               ("c", 8, np.nan), ("d", 2, np.inf), ("d", 3, np.nan)]:
        cases[f"{value} in {name}[{index}]"] = _file(tmp_path, (name, index, value))
    return cases


@pytest.mark.parametrize("pieces", ["1", "3", "7", "random", "all"])
def test_streamed_outcomes_match_the_file_reader(tmp_path: Path, pieces: str) -> None:
    for name, content in _cases(tmp_path).items():
        expected = _on_disk(tmp_path, content)
        assert _streamed(content, _pieces(pieces)) == expected, name
    # The cases do cover both answers and every kind of refusal.
    codes = {_on_disk(tmp_path, c)[0] for c in _cases(tmp_path).values()}
    assert codes == {"ok", "non_finite_values", "safetensors_size_mismatch",
                     "safetensors_header_too_large", "invalid_safetensors"}
