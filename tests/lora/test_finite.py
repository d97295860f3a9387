"""``first_non_finite`` against numpy's own reading of the same bits (numpy is only a
test dependency now)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplane.lora.finite import first_non_finite
from loraplane.lora.safetensors import FLOAT_BITS

_UINT = {2: "<u2", 4: "<u4", 8: "<u8"}


def _numpy_first(data: bytes, size: int, exponent: int) -> int | None:
    values = np.frombuffer(data, dtype=_UINT[size])
    hits = (values & np.array(exponent, dtype=_UINT[size])) == exponent
    return int(np.argmax(hits)) if hits.any() else None


@settings(max_examples=400, deadline=None)
@given(dtype=st.sampled_from(sorted(FLOAT_BITS)), data=st.data())
def test_agrees_with_numpy_on_any_bits(dtype: str, data: st.DataObject) -> None:
    layout = FLOAT_BITS[dtype]
    # Values near the exponent's edges as well as arbitrary ones: all exponent bits set,
    # all but the lowest, the top byte alone.
    top = layout.exponent | layout.sign
    edgy = st.sampled_from([layout.exponent, layout.exponent | 1, top,
                            layout.exponent & ~(layout.exponent & -layout.exponent),
                            layout.exponent >> 8 * (layout.size - 1) << 8 * (layout.size - 1)])
    word = st.one_of(st.integers(0, 2 ** (8 * layout.size) - 1), edgy)
    words = data.draw(st.lists(word, max_size=300))
    raw = b"".join(w.to_bytes(layout.size, "little") for w in words)
    assert first_non_finite(raw, layout.size, layout.exponent) \
        == _numpy_first(raw, layout.size, layout.exponent)
    # A window of a longer buffer: only the values before ``stop`` count.
    cut = len(words) // 2 * layout.size
    assert first_non_finite(raw + raw, layout.size, layout.exponent, cut) \
        == _numpy_first(raw[:cut], layout.size, layout.exponent)


@pytest.mark.parametrize("dtype", sorted(FLOAT_BITS))
def test_huge_finite_values_are_not_taken_for_inf(dtype: str) -> None:
    """The largest finite values: for all but F16 every top byte could begin an Inf, so
    only the byte below decides; the one NaN among them is still found where it is."""
    layout = FLOAT_BITS[dtype]
    largest = (layout.exponent - (layout.exponent & -layout.exponent)) | layout.mantissa
    values = [largest, largest | layout.sign] * 50_000
    raw = bytearray(b"".join(v.to_bytes(layout.size, "little") for v in values))
    assert first_non_finite(raw, layout.size, layout.exponent) is None
    nan = layout.exponent | 1
    raw[77_777 * layout.size:77_778 * layout.size] = nan.to_bytes(layout.size, "little")
    assert first_non_finite(raw, layout.size, layout.exponent) == 77_777


def test_an_exponent_that_does_not_start_in_the_top_byte_is_refused() -> None:
    with pytest.raises(ValueError, match="top byte"):
        first_non_finite(b"\0" * 8, 4, 0x00FF0000)
    with pytest.raises(ValueError, match="top byte"):
        first_non_finite(b"\0" * 8, 4, 0x7FFF8000)
