"""Safe extraction of uploaded adapter archives (.tar.gz/.tgz/.tar and .zip).

Nothing from the archive is trusted: names are normalised and refused when
they could escape ``dest``; only regular files are written, by this module,
with its own permissions; sizes are counted from the bytes actually
decompressed; and a refusal removes everything written so far.
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NoReturn, Protocol, TypeVar

from loraplane.lora.errors import AdapterInvalid

CHUNK_BYTES = 1024 * 1024
MAX_NAME_CHARS = 1024
MAX_NAME_DEPTH = 32
MAX_COMPONENT_BYTES = 255
# A single tar metadata record (pax header, GNU long name) above this is
# refused: tarfile reads each one into memory in one piece.
MAX_TAR_METADATA_READ = 1024 * 1024
# Tar framing per member (headers, pax records, padding) allowed on top of
# the file bytes before the archive counts as a decompression bomb.
TAR_OVERHEAD_PER_MEMBER = 8192
# Default cap on decompressed bytes per compressed byte. Adapter weights are floats and
# barely compress (an untrained adapter's zero lora_B halves its size at most); a
# deflate bomb reaches about 1,000.
DEFAULT_MAX_EXPANSION_RATIO = 100.0
# Expansion up to this many bytes is never judged by ratio: tiny files compress oddly.
RATIO_FLOOR_BYTES = 1024 * 1024
_ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
_READ_ERRORS = (
    tarfile.TarError,
    zipfile.BadZipFile,
    zlib.error,
    EOFError,
    gzip.BadGzipFile,
    NotImplementedError,
    RecursionError,
    # zipfile decodes names flagged UTF-8 and lets a bad one through as this.
    UnicodeDecodeError,
)


@dataclass(frozen=True)
class _Limits:
    max_total_bytes: int
    max_members: int
    max_file_bytes: int
    # None: expansion is bounded by the totals only.
    max_ratio: float | None = None

    def expansion_allowance(self, compressed: int) -> int | None:
        """The most ``compressed`` bytes may expand to, or None when unbounded by ratio."""
        if self.max_ratio is None:
            return None
        return max(int(self.max_ratio * compressed), RATIO_FLOOR_BYTES)


def _unsafe(message: str, name: str) -> NoReturn:
    printable = name.encode("utf-8", "backslashreplace").decode("utf-8")
    raise AdapterInvalid("unsafe_archive", message, {"member": printable})


def _invalid(message: str) -> NoReturn:
    raise AdapterInvalid("invalid_archive", message)


def extract_archive(
    src: Path,
    dest: Path,
    *,
    max_total_bytes: int,
    max_members: int,
    max_file_bytes: int,
    max_expansion_ratio: float | None = DEFAULT_MAX_EXPANSION_RATIO,
) -> list[Path]:
    """Extract ``src`` into ``dest`` (missing or empty) and return the files written.

    One top-level directory shared by every file is stripped. Decompressed bytes may
    not exceed ``max_expansion_ratio`` times their compressed size (per zip member and
    for the whole archive; None turns the ratio off). Sizes the headers declare are
    checked before anything is written, and the bytes actually decompressed while
    writing. Raises :class:`AdapterInvalid` (``invalid_archive``, ``unsafe_archive``,
    ``archive_too_large``, ``archive_expansion_ratio``, ``file_too_large``) after
    removing all it wrote.
    """
    src, dest = Path(src), Path(dest)
    kind = _sniff(src)
    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    if not created and any(dest.iterdir()):
        raise ValueError(f"extraction target {dest} is not empty")
    if max_expansion_ratio is not None and max_expansion_ratio < 1:
        raise ValueError("max_expansion_ratio must be at least 1")
    limits = _Limits(max_total_bytes, max_members, max_file_bytes, max_expansion_ratio)
    try:
        return _extract_into(src, dest, kind, limits)
    except BaseException:
        _clear(dest, remove_dir=created)
        raise


def _extract_into(src: Path, dest: Path, kind: str, limits: _Limits) -> list[Path]:
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=dest))
    try:
        writer = _Writer(staging, limits, limits.expansion_allowance(src.stat().st_size))
        try:
            if kind == "zip":
                _extract_zip(src, writer)
            else:
                _extract_tar(src, writer, compressed=kind == "gzip")
        except _READ_ERRORS as exc:
            _invalid(f"cannot read archive: {exc or type(exc).__name__}")
        except OSError as exc:
            # A corrupt zip offset makes zipfile seek before the start (EINVAL); other
            # OSErrors (a full disk) are the server's, not the archive's.
            if exc.errno != errno.EINVAL:
                raise
            _invalid("cannot read archive: an offset points outside the file")
        return _promote(staging, dest, writer.files)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _clear(dest: Path, *, remove_dir: bool) -> None:
    # dest was empty (or absent) on entry, so everything in it is ours.
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    if remove_dir:
        dest.rmdir()


def _sniff(src: Path) -> str:
    # The content decides, not the file name a client chose.
    with src.open("rb") as f:
        head = f.read(512)
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[257:262] == b"ustar":
        return "tar"
    _invalid("not a .tar.gz, .tar or .zip archive")


def _normalize(name: str, *, is_dir: bool) -> tuple[str, ...]:
    if any(ch in name for ch in "\\\x00") or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
        _unsafe("member name contains a backslash or control character", name)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        _unsafe("member name is not valid UTF-8", name)
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        _unsafe(f"absolute member path {name!r}", name)
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        _unsafe(f"member path {name!r} contains '..'", name)
    if len(name) > MAX_NAME_CHARS or len(parts) > MAX_NAME_DEPTH:
        _unsafe("member path is too long or too deep", name)
    if any(len(p.encode("utf-8")) > MAX_COMPONENT_BYTES for p in parts):
        _unsafe("member path has a component longer than 255 bytes", name)
    if not parts and not is_dir:
        _unsafe("file member has an empty name", name)
    return parts


class _Writer:
    """Writes regular files under ``root`` while enforcing the limits."""

    def __init__(self, root: Path, limits: _Limits, allowance: int | None = None) -> None:
        self.root = root
        self.limits = limits
        # What the whole archive may expand to by ratio; its real size cannot lie.
        self.allowance = allowance
        self.members = 0
        self.total_bytes = 0
        self.files: list[tuple[str, ...]] = []
        self._seen: set[str] = set()
        self._file_keys: set[str] = set()
        self._dir_keys: set[str] = set()

    def count_member(self) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            self.too_many_members()

    def too_many_members(self) -> NoReturn:
        raise AdapterInvalid(
            "archive_too_large",
            f"archive has more than {self.limits.max_members} members",
            {"max_members": self.limits.max_members},
        )

    def _claim(self, name: str, parts: tuple[str, ...], *, is_dir: bool) -> None:
        key = "/".join(parts)
        if key in self._seen:
            _unsafe(f"duplicate member name {key!r}", name)
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts))]
        if any(p in self._file_keys for p in prefixes) or (key in self._file_keys):
            _unsafe(f"member {key!r} conflicts with a file of the same name", name)
        if not is_dir and key in self._dir_keys:
            _unsafe(f"file {key!r} conflicts with a directory of the same name", name)
        self._seen.add(key)
        self._dir_keys.update(prefixes)
        (self._dir_keys if is_dir else self._file_keys).add(key)

    def add_dir(self, name: str) -> None:
        parts = _normalize(name, is_dir=True)
        if parts:
            self._claim(name, parts, is_dir=True)

    def check_declared(self, name: str, size: int, total: int | None = None) -> None:
        """Refuse from a header, before writing; the real limits count decompressed bytes.

        ``total`` is what the archive declares in all when it is known up front (zip).
        """
        total = self.total_bytes + size if total is None else total
        if size > self.limits.max_file_bytes:
            self._file_too_large(name)
        if total > self.limits.max_total_bytes:
            self._total_too_large()
        if self.allowance is not None and total > self.allowance:
            self.over_ratio(name)

    def add_file(self, name: str, stream: IO[bytes], allowance: int | None = None) -> None:
        """Write one member; ``allowance`` caps its expansion by ratio (zip members)."""
        parts = _normalize(name, is_dir=False)
        self._claim(name, parts, is_dir=False)
        target = self.root.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(target, flags, 0o644), "wb") as out:
            written = 0
            while chunk := stream.read(CHUNK_BYTES):
                written += len(chunk)
                self.total_bytes += len(chunk)
                if written > self.limits.max_file_bytes:
                    self._file_too_large(name)
                if self.total_bytes > self.limits.max_total_bytes:
                    self._total_too_large()
                if any(a is not None and n > a for n, a in ((written, allowance),
                                                           (self.total_bytes, self.allowance))):
                    self.over_ratio(name)
                out.write(chunk)
        self.files.append(parts)

    def _file_too_large(self, name: str) -> NoReturn:
        raise AdapterInvalid(
            "file_too_large",
            f"archive member {name!r} is larger than {self.limits.max_file_bytes} bytes",
            {"member": name, "max_file_bytes": self.limits.max_file_bytes},
        )

    def over_ratio(self, name: str) -> NoReturn:
        raise AdapterInvalid(
            "archive_expansion_ratio",
            f"archive expands more than {self.limits.max_ratio:g} times its compressed "
            f"size (at member {name!r})",
            {"member": name, "max_expansion_ratio": self.limits.max_ratio},
        )

    def _total_too_large(self) -> NoReturn:
        raise AdapterInvalid(
            "archive_too_large",
            f"archive expands to more than {self.limits.max_total_bytes} bytes",
            {"max_total_bytes": self.limits.max_total_bytes},
        )


def _promote(staging: Path, dest: Path, files: list[tuple[str, ...]]) -> list[Path]:
    strip = 1 if files and len({p[0] for p in files}) == 1 and min(map(len, files)) > 1 else 0
    placed: list[Path] = []
    for parts in files:
        final = dest.joinpath(*parts[strip:])
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging.joinpath(*parts), final)
        placed.append(final)
    return sorted(placed)


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

    def __init__(self, inner: _Seekable, writer: _Writer) -> None:
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


def _extract_tar(src: Path, writer: _Writer, *, compressed: bool) -> None:
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
        _invalid("cannot read archive: a tar header is truncated")


def _tar_member(
    archive: tarfile.TarFile, member: tarfile.TarInfo, writer: _Writer, guard: _TarGuard
) -> None:
    name = member.name
    if member.issym() or member.islnk():
        _unsafe(f"member {name!r} is a link", name)
    if member.ischr() or member.isblk() or member.isfifo():
        _unsafe(f"member {name!r} is a device or fifo", name)
    if member.issparse():
        _unsafe(f"member {name!r} is a sparse file", name)
    if member.isdir():
        writer.add_dir(name)
        return
    if not member.isreg():
        _unsafe(f"member {name!r} has unsupported type {member.type!r}", name)
    writer.check_declared(name, member.size)
    stream = archive.extractfile(member)
    if stream is None:
        _invalid(f"cannot read member {name!r}")
    with guard.data(), stream:
        writer.add_file(name, stream)


def _zip_kind(info: zipfile.ZipInfo) -> str:
    mode = info.external_attr >> 16
    kind = stat.S_IFMT(mode)
    if kind == stat.S_IFLNK:
        _unsafe(f"member {info.filename!r} is a symlink", info.filename)
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        _unsafe(f"member {info.filename!r} is a device, fifo or socket", info.filename)
    return "dir" if info.is_dir() or kind == stat.S_IFDIR else "file"


def _extract_zip(src: Path, writer: _Writer) -> None:
    with zipfile.ZipFile(src) as archive:
        infos = archive.infolist()
        if len(infos) > writer.limits.max_members:
            # The central directory is already known: refuse before writing.
            writer.too_many_members()
        _check_zip_headers(infos, writer)
        for info in infos:
            writer.count_member()
            _zip_member(archive, info, writer)


def _check_zip_headers(infos: list[zipfile.ZipInfo], writer: _Writer) -> None:
    """Refuse from the central directory, before a byte is written."""
    total = 0
    for info in infos:
        total += info.file_size
        writer.check_declared(info.filename, info.file_size, total)
        allowance = writer.limits.expansion_allowance(info.compress_size)
        if allowance is not None and info.file_size > allowance:
            writer.over_ratio(info.filename)


def _zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, writer: _Writer) -> None:
    if "\x00" in info.orig_filename:
        _unsafe("member name contains a NUL byte", info.orig_filename)
    if not info.filename:
        # Checked before anything reads it: zipfile's is_dir() indexes its last character.
        _unsafe("member has an empty name", info.orig_filename)
    if _zip_kind(info) == "dir":
        writer.add_dir(info.filename)
        return
    if info.flag_bits & 0x1:
        _invalid(f"member {info.filename!r} is encrypted")
    if info.compress_type not in _ZIP_METHODS:
        _invalid(f"member {info.filename!r} uses an unsupported compression method")
    writer.check_declared(info.filename, info.file_size)
    # zipfile stops at the declared size; this holds whatever a reader does.
    allowance = writer.limits.expansion_allowance(info.compress_size)
    with archive.open(info) as stream:
        writer.add_file(info.filename, stream, allowance)
