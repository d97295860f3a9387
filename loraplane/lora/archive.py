"""Safe extraction of uploaded adapter archives (.tar.gz/.tgz/.tar and .zip).

Nothing from the archive is trusted: names are normalised and refused when
they could escape ``dest``; only regular files are written, by this module,
with its own permissions; sizes are counted from the bytes actually
decompressed; and a refusal removes everything written so far.
"""

from __future__ import annotations

import errno
import gzip
import os
import shutil
import tarfile
import tempfile
import zipfile
import zlib
from pathlib import Path

from loraplane.lora.archive_tar import extract_tar
from loraplane.lora.archive_writer import DEFAULT_MAX_EXPANSION_RATIO, Limits, Writer, invalid
from loraplane.lora.archive_zip import extract_zip

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
    limits = Limits(max_total_bytes, max_members, max_file_bytes, max_expansion_ratio)
    try:
        return _extract_into(src, dest, kind, limits)
    except BaseException:
        _clear(dest, remove_dir=created)
        raise


def _extract_into(src: Path, dest: Path, kind: str, limits: Limits) -> list[Path]:
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=dest))
    try:
        writer = Writer(staging, limits, limits.expansion_allowance(src.stat().st_size))
        try:
            if kind == "zip":
                extract_zip(src, writer)
            else:
                extract_tar(src, writer, compressed=kind == "gzip")
        except _READ_ERRORS as exc:
            invalid(f"cannot read archive: {exc or type(exc).__name__}")
        except OSError as exc:
            # A corrupt zip offset makes zipfile seek before the start (EINVAL); other
            # OSErrors (a full disk) are the server's, not the archive's.
            if exc.errno != errno.EINVAL:
                raise
            invalid("cannot read archive: an offset points outside the file")
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
    invalid("not a .tar.gz, .tar or .zip archive")


def _promote(staging: Path, dest: Path, files: list[tuple[str, ...]]) -> list[Path]:
    strip = 1 if files and len({p[0] for p in files}) == 1 and min(map(len, files)) > 1 else 0
    placed: list[Path] = []
    for parts in files:
        final = dest.joinpath(*parts[strip:])
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging.joinpath(*parts), final)
        placed.append(final)
    return sorted(placed)
