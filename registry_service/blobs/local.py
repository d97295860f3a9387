"""Blob store in a local directory: the embedded default.

A blob only ever appears under its final name by an atomic rename of a fully written
and fsynced temporary file in the same directory, so a crash leaves at worst a stray
``.tmp`` file, never a truncated blob under a real key.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from loraplane.private_files import FILE_MODE, make_dirs, open_private, private_dir
from registry_service.blobs.base import (
    DEFAULT_CHUNK_SIZE,
    BlobStream,
    StoredBlob,
    blob_key,
)
from registry_service.blobs.walk_store import TEMP_SUFFIX
from registry_service.errors import BlobNotFound, BlobStoreFull, BlobStoreUnavailable

_COPY_BUFFER = 1024 * 1024
# Bytes of the listing read (and turned into blobs) between two turns of the event loop:
# about 200 blobs.
LIST_READ_BYTES = 16 * 1024


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
        async with walk_child("sweep", str(self.root), repr(older_than_s)) as out:
            removed = await out.read()  # one number
        return int(removed)

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
        # Walked by a child process (walk_store.py): its CPU never takes the GIL from
        # the event loop, and the pipe holds it one read ahead of the collector.
        async with walk_child("list", str(self.root)) as lines:
            while chunk := await lines.read(LIST_READ_BYTES):
                chunk += await lines.readline()  # to the end of the last line
                for line in chunk.splitlines():
                    yield _stored_blob(line)
                # A read the pipe's buffer answers does not suspend: requests go first.
                await asyncio.sleep(0)

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


WALK_SCRIPT = str(Path(__file__).with_name("walk_store.py"))


@contextlib.asynccontextmanager
async def walk_child(*args: str) -> AsyncIterator[asyncio.StreamReader]:
    """``walk_store.py`` run with ``args`` in a child process, its output as a stream.

    Read to the end, the child's exit is checked: a walk that failed raises
    ``BlobStoreUnavailable`` with what it printed. Left early (a pass cancelled, a
    listing not read to its end), the child is killed."""
    try:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-I", WALK_SCRIPT, *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            # A terminal's Ctrl-C goes to the registry, whose shutdown ends the walk.
            start_new_session=True)
    except OSError as exc:
        raise _unavailable(exc, "walk the store") from exc
    if child.stdout is None or child.stderr is None:
        raise RuntimeError("the store's walk has no pipes")
    try:
        yield child.stdout
        if not child.stdout.at_eof():
            raise RuntimeError("the store's walk was left before its end")
        said = await child.stderr.read(4096)
        if await child.wait() != 0:
            raise BlobStoreUnavailable(
                "local blob store: its walk failed",
                detail={"exit_code": child.returncode,
                        "stderr": said.decode(errors="replace")[-1000:]})
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


def _stored_blob(line: bytes) -> StoredBlob:
    name, _, mtime_ns = line.partition(b" ")
    return StoredBlob(name.decode("ascii"), datetime.fromtimestamp(int(mtime_ns) / 1e9, UTC))
