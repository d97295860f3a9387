"""Blob store in a local directory: the embedded default.

A blob only ever appears under its final name by an atomic rename of a fully written
and fsynced temporary file in the same directory, so a crash leaves at worst a stray
``.tmp`` file, never a truncated blob under a real key.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import os
import stat
import time
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from loraplane.private_files import FILE_MODE, make_dirs, open_private, private_dir
from registry_service.blobs.base import (
    DEFAULT_CHUNK_SIZE,
    BlobStream,
    StoredBlob,
    blob_key,
    sha256_of_key,
)
from registry_service.errors import BlobNotFound, BlobStoreFull, BlobStoreUnavailable

_COPY_BUFFER = 1024 * 1024
TEMP_SUFFIX = ".tmp"
# Blobs listed per trip to a thread.
LIST_BATCH = 1000


# Out of space, or over a quota: 507 insufficient_storage, as a full staging folder.
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def _unavailable(exc: OSError, op: str,
                 sha256: str | None = None) -> BlobStoreUnavailable | BlobStoreFull:
    detail: dict[str, object] = {"op": op, "errno": errno.errorcode.get(exc.errno or 0, "")}
    if sha256 is not None:
        detail["sha256"] = sha256
    if exc.errno in _DISK_FULL:
        return BlobStoreFull(f"the local blob store is full (failed to {op}); free space or "
                             "try again later", detail=detail)
    return BlobStoreUnavailable(f"local blob store failed to {op}: {exc.strerror}", detail=detail)


def _fsync_dir(path: Path) -> None:
    # The rename is only durable once the directory entry itself reaches the disk.
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_durably(src: Path, dst: Path) -> int:
    """Copy src to a new file dst, fsync it, and return the number of bytes written."""
    written = 0
    with src.open("rb") as fsrc:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        with os.fdopen(fd, "wb") as fdst:
            while chunk := fsrc.read(_COPY_BUFFER):
                fdst.write(chunk)
                written += len(chunk)
            fdst.flush()
            os.fsync(fdst.fileno())
    return written


class LocalBlobStore:
    """Blobs as files under ``root/sha256/<ab>/<cd>/<hex>``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path_for(self, sha256: str) -> Path:
        return self.root / blob_key(sha256)

    async def put_file(self, sha256: str, path: Path, size: int) -> None:
        final = self.path_for(sha256)
        await asyncio.to_thread(self._put_sync, sha256, Path(path), size, final)

    def _put_sync(self, sha256: str, src: Path, size: int, final: Path) -> None:
        actual = src.stat().st_size
        if actual != size:
            raise ValueError(f"{src} has {actual} bytes, expected {size}")
        try:
            if final.is_file() and final.stat().st_size == size:
                return
            make_dirs(final.parent)
        except OSError as exc:
            raise _unavailable(exc, "prepare a blob directory", sha256) from exc
        # A unique name per writer: two uploads of the same blob may race, and each
        # must rename only its own complete copy.
        tmp = final.parent / f".{sha256}.{uuid.uuid4().hex}{TEMP_SUFFIX}"
        try:
            written = _copy_durably(src, tmp)
            if written != size:
                raise ValueError(f"{src} changed while being stored: {written} bytes, not {size}")
            os.replace(tmp, final)
            _fsync_dir(final.parent)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.filename == str(src):
                raise
            raise _unavailable(exc, "write a blob", sha256) from exc
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    async def open_writer(self, expected_sha256: str | None = None) -> LocalBlobWriter:
        # The name is only decided at the end, so the file starts at the store's root.
        try:
            await asyncio.to_thread(private_dir, self.root)
            tmp = self.root / f".upload.{uuid.uuid4().hex}{TEMP_SUFFIX}"
            handle = await asyncio.to_thread(open_private, tmp)
        except OSError as exc:
            raise _unavailable(exc, "start a blob") from exc
        return LocalBlobWriter(self, tmp, handle)

    async def sweep_incomplete(self, older_than_s: float) -> int:
        return await asyncio.to_thread(remove_stale_tmp, self.root, older_than_s)

    async def exists(self, sha256: str) -> bool:
        return await self.size(sha256) is not None

    async def size(self, sha256: str) -> int | None:
        path = self.path_for(sha256)
        return await asyncio.to_thread(self._size_sync, sha256, path)

    @staticmethod
    def _size_sync(sha256: str, path: Path) -> int | None:
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _unavailable(exc, "stat a blob", sha256) from exc

    async def open_stream(self, sha256: str, chunk_size: int = DEFAULT_CHUNK_SIZE) -> BlobStream:
        path = self.path_for(sha256)
        # Opened here, not lazily: a missing blob must fail before a response starts,
        # and an open descriptor keeps reading even if the blob is deleted meanwhile.
        try:
            handle = await asyncio.to_thread(path.open, "rb")
        except FileNotFoundError as exc:
            raise BlobNotFound("blob not found", detail={"sha256": sha256}) from exc
        except OSError as exc:
            raise _unavailable(exc, "open a blob", sha256) from exc
        size = os.fstat(handle.fileno()).st_size

        def map_error(exc: Exception) -> Exception:
            if isinstance(exc, OSError):
                return _unavailable(exc, "read a blob", sha256)
            return exc

        return BlobStream(
            handle, sha256=sha256, size=size, chunk_size=chunk_size, map_error=map_error
        )

    async def presigned_url(self, sha256: str, *, filename: str, expires_s: int) -> str | None:
        # Local files have no URL of their own: the registry streams them.
        blob_key(sha256)
        return None

    async def delete(self, sha256: str) -> None:
        path = self.path_for(sha256)
        try:
            await asyncio.to_thread(path.unlink, missing_ok=True)
        except OSError as exc:
            raise _unavailable(exc, "delete a blob", sha256) from exc

    async def list_blobs(self) -> AsyncIterator[StoredBlob]:
        # One walk, run a batch at a time in a thread (never two at once): memory holds a
        # batch, and the event loop only hands the batch on.
        walk = _walk_blobs(self.root)
        try:
            while batch := await asyncio.to_thread(_take, walk, LIST_BATCH):
                for blob in batch:
                    yield blob
        finally:
            # ValueError: a cancelled batch's thread still runs it, and ends it.
            with contextlib.suppress(ValueError):
                walk.close()

    async def check(self) -> None:
        await asyncio.to_thread(self._check_sync)

    def _check_sync(self) -> None:
        try:
            private_dir(self.root)
            # Writing is what uploads need; a read-only mount must fail readiness.
            probe = self.root / f".check.{uuid.uuid4().hex}{TEMP_SUFFIX}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise _unavailable(exc, f"use {self.root}") from exc

    async def close(self) -> None:
        return None


class LocalBlobWriter:
    """A blob written to a ``.tmp`` file and renamed to its key by ``finish``."""

    def __init__(self, store: LocalBlobStore, tmp: Path, handle: BinaryIO) -> None:
        self._store, self._tmp, self._handle = store, tmp, handle
        self.written = 0
        self._done = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self._handle.write(data)
        except OSError as exc:
            raise _unavailable(exc, "write a blob") from exc
        self.written += len(data)

    async def finish(self, sha256: str, size: int) -> None:
        if self.written != size:
            raise ValueError(f"{self.written} bytes were written, not {size}")
        await asyncio.to_thread(self._finish_sync, sha256, size)

    def _finish_sync(self, sha256: str, size: int) -> None:
        final = self._store.path_for(sha256)
        try:
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()
            if final.is_file() and final.stat().st_size == size:
                self._tmp.unlink()
            else:
                make_dirs(final.parent)
                os.replace(self._tmp, final)
                _fsync_dir(final.parent)
        except OSError as exc:
            raise _unavailable(exc, "write a blob", sha256) from exc
        self._done = True

    async def abort(self) -> None:
        if not self._done:
            self._done = True
            await asyncio.to_thread(self._abort_sync)

    def _abort_sync(self) -> None:
        self._handle.close()
        self._tmp.unlink(missing_ok=True)


def _scan(directory: str) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            yield from entries
    except (FileNotFoundError, NotADirectoryError):
        return


def _shard_dirs(root: Path) -> Iterator[str]:
    """Every ``root/sha256/<ab>/<cd>`` directory, found as the walk goes."""
    for top in _scan(os.path.join(root, "sha256")):
        if top.is_dir(follow_symlinks=False):
            for shard in _scan(top.path):
                if shard.is_dir(follow_symlinks=False):
                    yield shard.path


def _walk_blobs(root: Path) -> Generator[StoredBlob, None, None]:
    """Every blob file under ``root``, with little Python work per file: a thread
    running this shares the GIL with the event loop, and ``scandir``'s reads and
    ``stat`` let go of it."""
    for shard in _shard_dirs(root):
        # Hands the GIL to the event loop if it waits for it, a shard at a time.
        time.sleep(0)
        for entry in _scan(shard):
            # Temporary files start with a dot and never match a bare digest.
            if len(entry.name) != 64 or sha256_of_key(entry.name) is None:
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(info.st_mode):
                yield StoredBlob(entry.name, datetime.fromtimestamp(info.st_mtime, UTC))


def _take(walk: Iterator[StoredBlob], count: int) -> list[StoredBlob]:
    return list(itertools.islice(walk, count))


def remove_stale_tmp(root: Path, older_than_s: float) -> int:
    """Remove the ``.tmp`` files older than ``older_than_s`` where the store writes
    them: its root (streamed uploads) and its shard directories (blobs being put)."""
    cutoff = time.time() - older_than_s
    removed = 0
    for directory in itertools.chain((str(root),), _shard_dirs(root)):
        for entry in _scan(directory):
            if not (entry.name.startswith(".") and entry.name.endswith(TEMP_SUFFIX)):
                continue
            try:
                if entry.is_file(follow_symlinks=False) and \
                        entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
            except FileNotFoundError:
                continue
    return removed
