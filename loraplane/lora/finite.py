"""Finding the first NaN or Inf among little-endian IEEE floats, without numpy.

These checks run at C speed on ``bytes`` without importing numpy, which would cost every
registry and agent process its memory for this alone.
Why: docs/decisions.md#no-numpy-in-the-services

A value is NaN or Inf when every bit of its exponent is set. In every float dtype that
safetensors names, the exponent begins in the value's top byte and ends in it or in the
byte below. So the top byte of every value is sliced out (one C loop), and only where
some top byte can begin a non-finite value (for float32 and bfloat16, 0x7F or 0xFF:
values of magnitude 2**127 and more, which trained weights never hold) are the two bytes
compared as a whole, with translation tables and one integer AND, still in C.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True, slots=True)
class _ExponentBytes:
    """Where a dtype's exponent lies, byte by byte, for one value size."""

    # Top bytes that have every exponent bit of the top byte set, each as one byte.
    possible: tuple[bytes, ...]
    # Translation tables: a byte becomes 1 where it has every exponent bit of its place.
    top: bytes
    below: bytes | None  # None when the exponent lies wholly in the top byte


def _table(mask: int) -> bytes:
    return bytes(1 if byte & mask == mask else 0 for byte in range(256))


@cache
def _exponent_bytes(size: int, exponent: int) -> _ExponentBytes:
    if size < 2 or exponent >> 8 * size or exponent & ((1 << 8 * (size - 2)) - 1) \
            or not exponent >> 8 * (size - 1):
        raise ValueError(f"exponent {exponent:#x} of {size}-byte values does not begin in "
                         "the top byte and end in the two top bytes")
    top_mask = exponent >> 8 * (size - 1)
    below_mask = exponent >> 8 * (size - 2) & 0xFF
    possible = tuple(bytes([b]) for b in range(256) if b & top_mask == top_mask)
    return _ExponentBytes(possible, _table(top_mask),
                          _table(below_mask) if below_mask else None)


def first_non_finite(data: bytes | bytearray, size: int, exponent: int,
                     stop: int | None = None) -> int | None:
    """Index of the first value in ``data[:stop]`` with every ``exponent`` bit set, or
    None. The values are little-endian, ``size`` bytes each.

    ``bytes`` or ``bytearray`` only: slicing with a step is a C loop on them, and a
    generic copy per item on a ``memoryview``. A caller with a view copies it into a
    buffer it reuses (a fresh MiB would be an ``mmap`` and its page faults each time:
    registry_service/memory.py).
    """
    layout = _exponent_bytes(size, exponent)
    top = data[size - 1:stop:size]
    if not any(byte in top for byte in layout.possible):
        return None
    marks = int.from_bytes(top.translate(layout.top), "little")
    if layout.below is not None:
        marks &= int.from_bytes(data[size - 2:stop:size].translate(layout.below), "little")
    if not marks:
        return None
    return ((marks & -marks).bit_length() - 1) // 8
