"""Where the parts of an upload go as they arrive: a file in staging, or (the weights)
a blob writer, each hashed on the way. Flushes run in a worker thread."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from loraplane.buffers import copy_into
from loraplane.lora.safetensors_stream import SafetensorsStream
from registry_service.blobs.base import BlobWriter

# Bytes buffered per file before one write + hash in a worker thread.
FLUSH_BYTES = 4 * 1024 * 1024
# Smaller for a streamed file: its bytes are then copied into a part buffer as well.
STREAM_FLUSH_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ReceivedFile:
    name: str
    # None for a file streamed to the blob store (``ReceivedUpload.streams``).
    path: Path | None
    size: int
    sha256: str
    # What the client said the sha256 is (a Content-Digest header of its part).
    declared_sha256: str | None = None


class FileSink:
    """One file part: bytes are buffered here and written and hashed in a worker thread."""

    flush_bytes = FLUSH_BYTES

    def __init__(self, name: str, path: Path | None, declared: str | None) -> None:
        self.name, self.path, self.declared = name, path, declared
        self.size = 0
        self.finished = False
        self._handle: BinaryIO | None = path.open("xb") if path is not None else None
        self._digest = hashlib.sha256()
        self._pending: list[bytes] = []
        self.pending_bytes = 0
        # What ``take`` handed to the next ``flush``: its pieces, and whether they end it.
        self._batch: tuple[list[bytes], int, bool] = ([], 0, False)
        # Reused by every flush: a fresh buffer of a MiB per flush is an mmap, page faults
        # and a munmap each time (malloc's threshold is fixed, registry_service/memory.py),
        # which cost more CPU than hashing the same bytes.
        self._scratch = bytearray()

    def add(self, chunk: bytes) -> None:
        self._pending.append(chunk)
        self.pending_bytes += len(chunk)
        self.size += len(chunk)

    def take(self) -> None:
        """In the event loop: the pending pieces become the next ``flush``'s, so that new
        pieces can arrive while a thread flushes these."""
        self._batch = (self._pending, self.pending_bytes, self.finished)
        self._pending, self.pending_bytes = [], 0

    def flush(self) -> None:
        """Runs in a thread: hashing and file writes release the GIL."""
        pieces, size, last = self._batch
        self._batch = ([], 0, False)
        data = self._gathered(pieces, size)
        self._digest.update(data)
        self._consume(data)
        if last:
            self.close()

    def _gathered(self, pieces: list[bytes], size: int) -> bytes | memoryview:
        """The pieces as one buffer, valid until the next flush."""
        if len(pieces) == 1:
            return pieces[0]
        if len(self._scratch) < size:
            self._scratch = bytearray(size)
        position = 0
        for piece in pieces:
            copy_into(self._scratch, position, piece)
            position += len(piece)
        return memoryview(self._scratch)[:size]

    def _consume(self, data: bytes | memoryview) -> None:
        assert self._handle is not None
        self._handle.write(data)

    def close(self) -> None:
        self._scratch = bytearray()
        if self._handle is not None:
            self._handle.close()

    def received(self) -> ReceivedFile:
        return ReceivedFile(name=self.name, path=self.path, size=self.size,
                            sha256=self._digest.hexdigest(), declared_sha256=self.declared)


class StreamSink(FileSink):
    """The weights file: checked as it passes and written on to a blob writer."""

    flush_bytes = STREAM_FLUSH_BYTES

    def __init__(self, name: str, declared: str | None, max_header_bytes: int) -> None:
        super().__init__(name, None, declared)
        self.check = SafetensorsStream(max_header_bytes=max_header_bytes)
        self.writer: BlobWriter | None = None

    def _consume(self, data: bytes | memoryview) -> None:
        self.check.feed(data)
        # A file that will be refused is only counted from here on: S3 is spared it.
        if not self.check.failed:
            assert self.writer is not None
            self.writer.write(data)
