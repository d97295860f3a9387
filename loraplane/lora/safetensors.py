"""A strict, streaming reader for the safetensors format.

Layout: an 8-byte little-endian header length N, N bytes of UTF-8 JSON, then
the data section. Nothing here loads tensor data into memory as a whole; the
header is bounded and values are scanned in fixed-size chunks, so memory stays
flat whatever the file size.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

from loraplane.lora.errors import AdapterInvalid
from loraplane.lora.finite import first_non_finite

DEFAULT_MAX_HEADER_BYTES = 16 * 1024 * 1024
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024

# Width in bits of every dtype the safetensors specification defines.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "F8_E8M0": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
}

FLOAT_DTYPES: tuple[str, ...] = ("F16", "BF16", "F32", "F64")


@dataclass(frozen=True)
class _FloatBits:
    """IEEE-style bit layout: a value is NaN/Inf when all exponent bits are set."""

    size: int  # bytes per value, little-endian
    exponent: int
    mantissa: int
    sign: int


FLOAT_BITS: dict[str, _FloatBits] = {
    "F16": _FloatBits(2, 0x7C00, 0x03FF, 0x8000),
    "BF16": _FloatBits(2, 0x7F80, 0x007F, 0x8000),
    "F32": _FloatBits(4, 0x7F800000, 0x007FFFFF, 0x80000000),
    "F64": _FloatBits(8, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF, 0x8000000000000000),
}

_TENSOR_FIELDS = frozenset({"dtype", "shape", "data_offsets"})


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class SafetensorsHeader:
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int

    @property
    def data_bytes(self) -> int:
        return max((t.end for t in self.tensors.values()), default=0)


def _invalid(message: str, **detail: Any) -> NoReturn:
    raise AdapterInvalid("invalid_safetensors", message, detail)


def read_header(
    path: str | os.PathLike[str], *, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
) -> SafetensorsHeader:
    """Parse and fully cross-check the header of a safetensors file.

    Raises :class:`AdapterInvalid` with ``invalid_safetensors``,
    ``safetensors_header_too_large`` or ``safetensors_size_mismatch``.
    """
    path = Path(path)
    with path.open("rb") as f:
        file_size = os.fstat(f.fileno()).st_size
        raw = _read_header_bytes(f, file_size, max_header_bytes)
    return parse_header_bytes(raw, file_size - 8 - len(raw))


def parse_header_bytes(raw: bytes, data_len: int | None) -> SafetensorsHeader:
    """Parse and cross-check the JSON header ``raw``.

    ``data_len`` is the size of the data section after it; ``None`` when it is not known
    yet (the file is still arriving): the tensors must then tile a data section of
    exactly ``data_bytes``, which the caller checks against the real size at the end.
    """
    document = _decode_json(raw)
    metadata: dict[str, str] = {}
    tensors: dict[str, TensorInfo] = {}
    for key, value in document.items():
        if key == "__metadata__":
            metadata = _parse_metadata(value)
        else:
            tensors[key] = _parse_tensor(key, value, data_len)
    covered = max((t.end for t in tensors.values()), default=0)
    _check_layout(tensors.values(), covered if data_len is None else data_len)
    return SafetensorsHeader(tensors=tensors, metadata=metadata, data_start=8 + len(raw))


def _read_header_bytes(f: IO[bytes], file_size: int, max_header_bytes: int) -> bytes:
    if file_size < 8:
        _invalid(f"file is {file_size} bytes, shorter than the 8-byte header length")
    length = int.from_bytes(f.read(8), "little")
    if length > file_size - 8:
        # Checked before the size limit: a header longer than the file is a
        # truncated or foreign file, not an oversized one.
        raise AdapterInvalid(
            "safetensors_size_mismatch",
            f"header length {length} is larger than the {file_size - 8} bytes after it",
            {"header_bytes": length, "file_bytes": file_size},
        )
    if length > max_header_bytes:
        raise AdapterInvalid(
            "safetensors_header_too_large",
            f"header is {length} bytes, the limit is {max_header_bytes}",
            {"header_bytes": length, "max_header_bytes": max_header_bytes},
        )
    if length < 2:
        _invalid(f"header length {length} cannot hold a JSON object")
    raw = f.read(length)
    if len(raw) != length:
        raise AdapterInvalid(
            "safetensors_size_mismatch", "file ended inside the header", {"header_bytes": length}
        )
    return raw


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            # Two readers could otherwise disagree on which entry wins.
            _invalid(f"duplicate JSON key {key!r} in header", key=key)
        result[key] = value
    return result


def _reject_constant(token: str) -> NoReturn:
    _invalid(f"header JSON contains the non-standard constant {token}")


def _decode_json(raw: bytes) -> dict[str, Any]:
    if raw[:1] != b"{":
        _invalid("header must start with '{'")
    try:
        text = raw.decode("utf-8")
        document = json.loads(
            text, object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant
        )
    except UnicodeDecodeError as exc:
        _invalid(f"header is not valid UTF-8: {exc.reason} at byte {exc.start}")
    except RecursionError:
        _invalid("header JSON is nested too deeply")
    except ValueError as exc:
        _invalid(f"header is not valid JSON: {exc}")
    if not isinstance(document, dict):
        _invalid("header JSON must be an object")
    return document


def _parse_metadata(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        _invalid("__metadata__ must be an object of strings")
    for key, item in value.items():
        if not isinstance(item, str):
            _invalid(f"__metadata__ value for {key!r} must be a string", key=key)
    return dict(value)


def _is_uint(value: Any) -> bool:
    # bool is an int subclass in Python; JSON true/false must not pass as 1/0.
    return type(value) is int and value >= 0


def _parse_tensor(name: str, value: Any, data_len: int | None) -> TensorInfo:
    if not name:
        _invalid("tensor with an empty name")
    if not isinstance(value, dict) or set(value) != _TENSOR_FIELDS:
        _invalid(
            f"tensor {name!r} must have exactly the fields dtype, shape, data_offsets",
            tensor=name,
        )
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        _invalid(f"tensor {name!r} has unknown dtype {dtype!r}", tensor=name)
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        _invalid(f"tensor {name!r} shape must be a list of non-negative integers", tensor=name)
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_uint, offsets))):
        _invalid(f"tensor {name!r} data_offsets must be [begin, end]", tensor=name)
    begin, end = offsets
    if end < begin:
        _invalid(f"tensor {name!r} ends before it begins", tensor=name)
    needed = _tensor_bytes(name, shape, DTYPE_BITS[dtype], end - begin)
    if needed != end - begin:
        _invalid(
            f"tensor {name!r} spans {end - begin} bytes but {dtype}{shape} needs {needed}",
            tensor=name,
        )
    if data_len is not None and end > data_len:
        raise AdapterInvalid(
            "safetensors_size_mismatch",
            f"tensor {name!r} ends at byte {end} of a {data_len}-byte data section",
            {"tensor": name, "end": end, "data_bytes": data_len},
        )
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def _tensor_bytes(name: str, shape: list[int], bits: int, span: int) -> int:
    """The bytes a tensor of ``shape`` needs, refusing shapes larger than its ``span``.

    The shape's numbers come from the client and may be astronomically large: they are
    multiplied only while the product stays within the span, so no float or decimal
    conversion of a huge number is ever attempted.
    """
    if 0 in shape:
        return 0
    total = bits
    for dim in shape:
        total *= dim
        if total > 8 * span:
            _invalid(f"tensor {name!r} spans {span} bytes but its shape needs more",
                     tensor=name)
    if total % 8:
        _invalid(f"tensor {name!r} does not fill a whole number of bytes", tensor=name)
    return total // 8


def _check_layout(tensors: Iterable[TensorInfo], data_len: int) -> None:
    """Tensors must tile the data section exactly: no overlap, gap or tail."""
    position = 0
    previous = ""
    for info in sorted(tensors, key=lambda t: (t.begin, t.end)):
        if info.begin < position:
            _invalid(
                f"tensor {info.name!r} overlaps tensor {previous!r}",
                tensor=info.name,
                other=previous,
            )
        if info.begin > position:
            _invalid(
                f"{info.begin - position} unused bytes before tensor {info.name!r}",
                tensor=info.name,
            )
        position, previous = info.end, info.name
    if position != data_len:
        raise AdapterInvalid(
            "safetensors_size_mismatch",
            f"tensors cover {position} bytes but the data section has {data_len}",
            {"covered_bytes": position, "data_bytes": data_len},
        )


def check_float_dtypes(header: SafetensorsHeader) -> None:
    """Refuse tensors that are not F16, BF16, F32 or F64 with ``invalid_dtype``."""
    for info in header.tensors.values():
        if info.dtype not in FLOAT_BITS:
            raise AdapterInvalid(
                "invalid_dtype",
                f"tensor {info.name!r} has dtype {info.dtype}; LoRA weights must be one of "
                + ", ".join(FLOAT_DTYPES),
                {"tensor": info.name, "dtype": info.dtype, "allowed": list(FLOAT_DTYPES)},
            )


class _Scratch:
    """A buffer reused for every chunk, so a read allocates nothing per chunk."""

    def __init__(self, chunk_bytes: int) -> None:
        self.raw = bytearray(chunk_bytes)


def scan_finite(
    path: str | os.PathLike[str],
    header: SafetensorsHeader,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> None:
    """Read every tensor in bounded chunks and refuse NaN or Inf values.

    Raises ``invalid_dtype`` for non-float tensors (before reading any data)
    and ``non_finite_values`` naming the first offending tensor and element.
    """
    if chunk_bytes < 8:
        raise ValueError("chunk_bytes must be at least 8")
    check_float_dtypes(header)
    # No bigger than the largest tensor: a LoRA of a small model has tensors of a few KiB,
    # and zeroing two whole chunks for them cost more CPU than the agent's whole swap.
    largest = max((info.nbytes for info in header.tensors.values()), default=0)
    scratch = _Scratch(max(8, min(chunk_bytes, largest)))
    with Path(path).open("rb", buffering=0) as f:
        for info in sorted(header.tensors.values(), key=lambda t: t.begin):
            _scan_tensor(f, header.data_start, info, scratch)


def _scan_tensor(f: io.FileIO, data_start: int, info: TensorInfo, scratch: _Scratch) -> None:
    layout = FLOAT_BITS[info.dtype]
    itemsize = layout.size
    step = len(scratch.raw) // itemsize * itemsize
    f.seek(data_start + info.begin)
    done = 0
    while done < info.nbytes:
        size = min(step, info.nbytes - done)
        _read_exactly(f, memoryview(scratch.raw)[:size], info.name)
        position = first_non_finite(scratch.raw, itemsize, layout.exponent, size)
        if position is not None:
            raw = scratch.raw[position * itemsize:(position + 1) * itemsize]
            _raise_non_finite(info, done // itemsize + position,
                              int.from_bytes(raw, "little"), layout)
        done += size


def _read_exactly(f: io.FileIO, view: memoryview, tensor: str) -> None:
    filled = 0
    while filled < len(view):
        got = f.readinto(view[filled:])
        if not got:
            # The file shrank after its header was checked.
            raise AdapterInvalid(
                "safetensors_size_mismatch",
                f"file ended inside tensor {tensor!r}",
                {"tensor": tensor},
            )
        filled += got


def non_finite_error(info: TensorInfo, index: int, raw: int,
                     layout: _FloatBits) -> AdapterInvalid:
    kind = "nan" if raw & layout.mantissa else "-inf" if raw & layout.sign else "inf"
    return AdapterInvalid(
        "non_finite_values",
        f"tensor {info.name!r} contains {kind} at flat index {index}",
        {"tensor": info.name, "dtype": info.dtype, "index": index, "value": kind},
    )


def _raise_non_finite(info: TensorInfo, index: int, raw: int, layout: _FloatBits) -> NoReturn:
    raise non_finite_error(info, index, raw, layout)
