"""Checking a safetensors file while its bytes go by, for uploads that never touch disk.

The registry streams an upload's weights straight on to the blob store; this parser sees
each byte once, in order, as it passes: the header is parsed as soon as it is complete,
and every value is scanned for NaN/Inf in bounded pieces. It never raises while it is
fed: the first problem is kept and the rest of the file only counted, so the caller can
report problems in the same order as ``validate_adapter_dir`` does for a file on disk.
"""

from __future__ import annotations

from loraplane.buffers import copy_into
from loraplane.lora.errors import AdapterInvalid
from loraplane.lora.finite import first_non_finite
from loraplane.lora.safetensors import (
    DEFAULT_MAX_HEADER_BYTES,
    FLOAT_BITS,
    SafetensorsHeader,
    TensorInfo,
    non_finite_error,
    parse_header_bytes,
)

# Values are checked this many bytes at a time, each piece copied into one scratch buffer
# reused throughout: small enough for the heap (a MiB would be an mmap of its own,
# registry_service/memory.py) and to add little to an upload's peak memory.
_SCAN_BYTES = 256 * 1024


class SafetensorsStream:
    """Feed the file's bytes in order with ``feed``; then ask ``header()``."""

    def __init__(self, *, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES) -> None:
        self.max_header_bytes = max_header_bytes
        self.size = 0
        self._prefix = bytearray()
        self._declared: int | None = None
        self._header: SafetensorsHeader | None = None
        self._raw = b""
        self._error: AdapterInvalid | None = None
        self._scan_error: AdapterInvalid | None = None
        self._tensors: list[TensorInfo] = []
        self._index = 0
        self._position = 0  # bytes of the data section seen so far
        self._carry = b""  # the start of a value split between two pieces
        self._scratch = bytearray()  # values are copied here to be checked

    @property
    def failed(self) -> bool:
        """The file will be refused, whatever else arrives."""
        return self._error is not None or self._scan_error is not None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self.size += len(data)
        if self.failed:
            return
        view = memoryview(data)
        try:
            if self._header is None:
                view = self._feed_header(view)
                if self._header is None:
                    return
            self._scan(view)
        except AdapterInvalid as exc:
            self._error = exc

    def header(self) -> SafetensorsHeader:
        """The parsed header once every byte is in, or the header-level refusal."""
        declared = self._declared
        if self.size < 8:
            raise AdapterInvalid("invalid_safetensors", f"file is {self.size} bytes, shorter "
                                 "than the 8-byte header length", {})
        if declared is not None and declared > self.size - 8:
            raise AdapterInvalid(
                "safetensors_size_mismatch",
                f"header length {declared} is larger than the {self.size - 8} bytes after it",
                {"header_bytes": declared, "file_bytes": self.size})
        if self._error is not None:
            raise self._error
        assert self._header is not None  # the declared length arrived, so it was parsed
        data_len = self.size - self._header.data_start
        if data_len != self._header.data_bytes:
            # Parsed again knowing the size, for the very refusal a file on disk gets.
            parse_header_bytes(self._raw, data_len)
        return self._header

    def raise_scan_error(self, header: SafetensorsHeader) -> None:
        """Refuse NaN/Inf values found while the bytes went by (the scan of ``header``)."""
        if self._scan_error is not None:
            raise self._scan_error

    def _feed_header(self, view: memoryview) -> memoryview:
        want = 8 if self._declared is None else 8 + self._declared
        take = min(len(view), want - len(self._prefix))
        self._prefix += view[:take]
        view = view[take:]
        if self._declared is None and len(self._prefix) == 8:
            self._declared = int.from_bytes(self._prefix, "little")
            self._check_declared(self._declared)
            return self._feed_header(view)
        if self._declared is not None and len(self._prefix) == 8 + self._declared:
            self._raw = bytes(self._prefix[8:])
            self._header = parse_header_bytes(self._raw, None)
            self._tensors = sorted(self._header.tensors.values(), key=lambda t: t.begin)
            self._prefix = bytearray()
        return view

    def _check_declared(self, length: int) -> None:
        if length > self.max_header_bytes:
            raise AdapterInvalid(
                "safetensors_header_too_large",
                f"header is {length} bytes, the limit is {self.max_header_bytes}",
                {"header_bytes": length, "max_header_bytes": self.max_header_bytes})
        if length < 2:
            raise AdapterInvalid("invalid_safetensors",
                                 f"header length {length} cannot hold a JSON object", {})

    def _scan(self, view: memoryview) -> None:
        while view and self._index < len(self._tensors) and self._scan_error is None:
            info = self._tensors[self._index]
            offset = self._position - info.begin
            piece, view = view[:info.nbytes - offset], view[info.nbytes - offset:]
            if info.dtype in FLOAT_BITS:
                self._scan_piece(info, offset, piece)
            self._position += len(piece)
            if self._position == info.end:
                self._index += 1
                self._carry = b""
        # Bytes past the last tensor are counted (by ``size``) and refused by ``header()``.

    def _scan_piece(self, info: TensorInfo, offset: int, piece: memoryview) -> None:
        itemsize = FLOAT_BITS[info.dtype].size
        start = offset - len(self._carry)
        if self._carry:
            need = itemsize - len(self._carry)
            joined = self._carry + bytes(piece[:need])
            piece = piece[need:]
            if len(joined) < itemsize:
                self._carry = joined
                return
            self._check_values(info, start, joined)
            start += itemsize
        whole = len(piece) // itemsize * itemsize
        for low in range(0, whole, _SCAN_BYTES):
            self._check_values(info, start + low, piece[low:min(whole, low + _SCAN_BYTES)])
        self._carry = bytes(piece[whole:])

    def _check_values(self, info: TensorInfo, byte_start: int, buf: bytes | memoryview) -> None:
        layout = FLOAT_BITS[info.dtype]
        if isinstance(buf, bytes):
            position = first_non_finite(buf, layout.size, layout.exponent)
        else:
            if len(self._scratch) < len(buf):  # grown to the largest piece, _SCAN_BYTES
                self._scratch = bytearray(len(buf))
            copy_into(self._scratch, 0, buf)
            position = first_non_finite(self._scratch, layout.size, layout.exponent, len(buf))
        if position is not None:
            raw = bytes(buf[position * layout.size:(position + 1) * layout.size])
            index = byte_start // layout.size + position
            self._scan_error = non_finite_error(info, index, int.from_bytes(raw, "little"),
                                                layout)
