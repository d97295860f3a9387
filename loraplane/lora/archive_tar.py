"""Tar and tar.gz members, read through a guard that bounds what tarfile may read."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, TypeVar

from loraplane.lora.archive_writer import CHUNK_BYTES, Writer, invalid, unsafe
from loraplane.lora.errors import AdapterInvalid

# A single tar metadata record (pax header, GNU long name) above this is
# refused: tarfile reads each one into memory in one piece.
MAX_TAR_METADATA_READ = 1024 * 1024
# Tar framing per member (headers, pax records, padding) allowed on top of
# the file bytes before the archive counts as a decompression bomb.
TAR_OVERHEAD_PER_MEMBER = 8192


class _Seekable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...
    def seek(self, pos: int, whence: int = io.SEEK_SET, /) -> int: ...
    def tell(self) -> int: ...


class _TarGuard:
    """File object between tarfile and the (decompressed) archive bytes.

    tarfile reads each metadata record in one call, so oversized records are
    refused before they are read, and metadata as a whole has a budget that
    grows with the member limit, not with the file-size limit.
    """

    def __init__(self, inner: _Seekable, writer: Writer) -> None:
        limits = writer.limits
        self._writer = writer
        self._inner = inner
        self._position = inner.tell()
        self._in_data = False
        self._data_bytes = 0
        self._metadata_bytes = 0
        self._data_budget = limits.max_total_bytes + CHUNK_BYTES
        self._metadata_budget = (limits.max_members + 2) * TAR_OVERHEAD_PER_MEMBER

    @contextmanager
    def data(self) -> Iterator[None]:
        self._in_data = True
        try:
            yield
        finally:
            self._in_data = False

    def _consume(self, size: int) -> None:
        if self._in_data:
            self._data_bytes += size
        else:
            self._metadata_bytes += size
        allowance = self._writer.allowance
        if allowance is not None and self._data_bytes + self._metadata_bytes > (
                allowance + CHUNK_BYTES):
            # Everything gzip yields counts, framing too: the ratio is the stream's.
            self._writer.over_ratio("(tar stream)")
        if self._data_bytes > self._data_budget or self._metadata_bytes > self._metadata_budget:
            raise AdapterInvalid(
                "archive_too_large",
                "archive expands far beyond its file contents",
                {"max_total_bytes": self._data_budget - CHUNK_BYTES},
            )

    def read(self, size: int = -1, /) -> bytes:
        if size < 0 or (not self._in_data and size > MAX_TAR_METADATA_READ):
            raise AdapterInvalid(
                "archive_too_large",
                "tar metadata record is larger than the 1 MiB limit",
                {"record_bytes": size},
            )
        self._consume(size)
        data = self._inner.read(size)
        self._position += len(data)
        return data

    def seek(self, pos: int, whence: int = io.SEEK_SET, /) -> int:
        if whence != io.SEEK_SET:
            raise io.UnsupportedOperation("only absolute seeks are supported")
        # gzip seeks by decompressing: forward skips cost the bytes skipped,
        # backward ones a restart from the beginning.
        self._consume(pos - self._position if pos >= self._position else pos)
        self._position = self._inner.seek(pos)
        return self._position

    def tell(self) -> int:
        return self._position

    def write(self, b: bytes, /) -> int:
        raise io.UnsupportedOperation("read-only")

    def close(self) -> None:
        """The underlying file is closed by its owner."""


def extract_tar(src: Path, writer: Writer, *, compressed: bool) -> None:
    with src.open("rb") as raw:
        stream: _Seekable = gzip.GzipFile(fileobj=raw, mode="rb") if compressed else raw
        guard = _TarGuard(stream, writer)
        with _read_tar(lambda: tarfile.open(fileobj=guard, mode="r:")) as archive:
            while (member := _read_tar(archive.next)) is not None:
                writer.count_member()
                _tar_member(archive, member, writer, guard)


_T = TypeVar("_T")


def _read_tar(read: Callable[[], _T]) -> _T:
    """``read()``, with tarfile's IndexError on a truncated header as a refusal.

    tarfile reads the extension blocks of a GNU sparse header without checking their
    length, and indexes past the end of one cut off by the end of the archive.
    """
    try:
        return read()
    except IndexError:
        invalid("cannot read archive: a tar header is truncated")


def _tar_member(
    archive: tarfile.TarFile, member: tarfile.TarInfo, writer: Writer, guard: _TarGuard
) -> None:
    name = member.name
    if member.issym() or member.islnk():
        unsafe(f"member {name!r} is a link", name)
    if member.ischr() or member.isblk() or member.isfifo():
        unsafe(f"member {name!r} is a device or fifo", name)
    if member.issparse():
        unsafe(f"member {name!r} is a sparse file", name)
    if member.isdir():
        writer.add_dir(name)
        return
    if not member.isreg():
        unsafe(f"member {name!r} has unsupported type {member.type!r}", name)
    writer.check_declared(name, member.size)
    stream = archive.extractfile(member)
    if stream is None:
        invalid(f"cannot read member {name!r}")
    with guard.data(), stream:
        writer.add_file(name, stream)
