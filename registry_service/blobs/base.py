"""The contract every blob store meets, and the pieces the stores share.

Blobs are content-addressed: the key of a blob is derived from its sha256 alone, so
writing the same content twice lands on the same key and is harmless. Callers are
trusted to pass the digest they computed while receiving the bytes; stores check the
size (cheap) but do not re-hash (a second full read of a 1 GB file).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Protocol, runtime_checkable
from urllib.parse import quote

from registry_service.blobs.walk_store import SHA256_RE
from registry_service.errors import BlobStoreUnavailable, InvalidInput

DEFAULT_CHUNK_SIZE = 1024 * 1024
# Anything outside this set is replaced in the ASCII fallback filename; the exact
# name still travels in the RFC 5987 `filename*` parameter.
_UNSAFE_FILENAME_CHARS = re.compile(r"[^A-Za-z0-9._\- +@()\[\]]")


def validate_sha256(sha256: str) -> str:
    """Return the digest unchanged, or refuse it: keys and paths are built from it."""
    if not SHA256_RE.fullmatch(sha256):
        raise InvalidInput(
            "not a lowercase hex sha256 digest",
            code="invalid_sha256",
            detail={"sha256": sha256[:100]},
        )
    return sha256


def blob_key(sha256: str) -> str:
    """Object key of a blob: ``sha256/<ab>/<cd>/<hex>``.

    The two fan-out levels keep directories small for the local store and spread
    S3 key prefixes.
    """
    validate_sha256(sha256)
    return f"sha256/{sha256[0:2]}/{sha256[2:4]}/{sha256}"


def sha256_of_key(key: str) -> str | None:
    """The digest a store key or file name ends with, or None for anything else."""
    name = key.rsplit("/", 1)[-1]
    return name if SHA256_RE.fullmatch(name) else None


@dataclass(frozen=True, slots=True)
class StoredBlob:
    sha256: str
    # When the store last wrote it (file mtime, S3 LastModified), in UTC.
    modified: datetime


def content_disposition(filename: str) -> str:
    """An ``attachment`` Content-Disposition that survives any filename (RFC 6266)."""
    basename = filename.replace("\\", "/").rsplit("/", 1)[-1] or "blob"
    fallback = _UNSAFE_FILENAME_CHARS.sub("_", basename)
    encoded = quote(basename, safe="")
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}"


class _Reader(Protocol):
    def read(self, amt: int, /) -> bytes: ...

    def close(self) -> None: ...


class BlobStream(AsyncIterator[bytes]):
    """The chunks of one blob, read in a worker thread so the event loop never waits on I/O.

    ``size`` is known before the first chunk (for Content-Length). A stream that ends
    before ``size`` bytes raises ``BlobStoreUnavailable`` instead of passing silently
    as a short blob. Close it with ``aclose()`` or ``async with`` when you stop early.
    """

    def __init__(
        self,
        reader: _Reader,
        *,
        sha256: str,
        size: int,
        chunk_size: int,
        map_error: Callable[[Exception], Exception],
    ) -> None:
        if chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        self.sha256 = sha256
        self.size = size
        self._reader = reader
        self._chunk_size = chunk_size
        self._map_error = map_error
        self._received = 0
        self._closed = False

    def __aiter__(self) -> BlobStream:
        return self

    async def __anext__(self) -> bytes:
        if self._closed:
            raise StopAsyncIteration
        try:
            chunk = await asyncio.to_thread(self._reader.read, self._chunk_size)
        except Exception as exc:
            await self.aclose()
            raise self._map_error(exc) from exc
        if chunk:
            self._received += len(chunk)
            return chunk
        await self.aclose()
        if self._received != self.size:
            raise BlobStoreUnavailable(
                "blob stream ended before its full size",
                detail={"sha256": self.sha256, "expected": self.size, "got": self._received},
            )
        raise StopAsyncIteration

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Closing a socket-backed body can block on the connection pool.
        await asyncio.to_thread(self._reader.close)

    async def __aenter__(self) -> BlobStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class BlobWriter(Protocol):
    """One blob written as its bytes arrive, before its digest is known for certain.

    Nothing is visible under a blob key until ``finish``; ``abort`` leaves nothing.
    """

    written: int

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Called from a worker thread, never the event loop: it may block on I/O."""
        ...

    async def finish(self, sha256: str, size: int) -> None:
        """Store the bytes written as the blob ``sha256`` (a no-op when it is stored)."""
        ...

    async def abort(self) -> None:
        """Discard the bytes; a no-op after ``finish``. Never raises."""
        ...


@runtime_checkable
class BlobStore(Protocol):
    """Content-addressed blob storage. Every method may raise ``BlobStoreUnavailable``."""

    async def put_file(self, sha256: str, path: Path, size: int) -> None:
        """Store the file at ``path`` under ``sha256``, streaming it from disk.

        Idempotent: storing content that is already there is a no-op. Raises
        ``ValueError`` when the file's size is not ``size``.
        """
        ...

    async def open_writer(self, expected_sha256: str | None = None) -> BlobWriter:
        """Start a blob whose bytes are about to stream in; ``expected_sha256`` is what
        the client declared (``finish`` is only called when the bytes match it)."""
        ...

    async def sweep_incomplete(self, older_than_s: float) -> int:
        """Remove what uploads that never finished left (a registry killed mid-upload):
        begun more than ``older_than_s`` ago. Returns how many."""
        ...

    async def exists(self, sha256: str) -> bool: ...

    async def size(self, sha256: str) -> int | None:
        """Size in bytes, or None when the blob is absent."""
        ...

    async def open_stream(self, sha256: str, chunk_size: int = DEFAULT_CHUNK_SIZE) -> BlobStream:
        """Open the blob for reading. Raises ``BlobNotFound`` here, before any byte is sent."""
        ...

    async def presigned_url(self, sha256: str, *, filename: str, expires_s: int) -> str | None:
        """A time-limited download URL, or None when the caller must stream the blob itself."""
        ...

    async def delete(self, sha256: str) -> None:
        """Remove the blob; deleting an absent blob is a no-op."""
        ...

    def list_blobs(self) -> AsyncIterator[StoredBlob]:
        """Every complete blob in the store, in no particular order (a page at a time)."""
        ...

    async def check(self) -> None:
        """Readiness probe: returns when the store can be used, else raises."""
        ...

    async def close(self) -> None: ...
