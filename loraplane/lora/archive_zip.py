"""Zip members, judged from the central directory before a byte is written."""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path

from loraplane.lora.archive_writer import Writer, invalid, unsafe

_ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)


def _zip_kind(info: zipfile.ZipInfo) -> str:
    mode = info.external_attr >> 16
    kind = stat.S_IFMT(mode)
    if kind == stat.S_IFLNK:
        unsafe(f"member {info.filename!r} is a symlink", info.filename)
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        unsafe(f"member {info.filename!r} is a device, fifo or socket", info.filename)
    return "dir" if info.is_dir() or kind == stat.S_IFDIR else "file"


def extract_zip(src: Path, writer: Writer) -> None:
    with zipfile.ZipFile(src) as archive:
        infos = archive.infolist()
        if len(infos) > writer.limits.max_members:
            # The central directory is already known: refuse before writing.
            writer.too_many_members()
        _check_zip_headers(infos, writer)
        for info in infos:
            writer.count_member()
            _zip_member(archive, info, writer)


def _check_zip_headers(infos: list[zipfile.ZipInfo], writer: Writer) -> None:
    """Refuse from the central directory, before a byte is written."""
    total = 0
    for info in infos:
        total += info.file_size
        writer.check_declared(info.filename, info.file_size, total)
        allowance = writer.limits.expansion_allowance(info.compress_size)
        if allowance is not None and info.file_size > allowance:
            writer.over_ratio(info.filename)


def _zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, writer: Writer) -> None:
    if "\x00" in info.orig_filename:
        unsafe("member name contains a NUL byte", info.orig_filename)
    if not info.filename:
        # Checked before anything reads it: zipfile's is_dir() indexes its last character.
        unsafe("member has an empty name", info.orig_filename)
    if _zip_kind(info) == "dir":
        writer.add_dir(info.filename)
        return
    if info.flag_bits & 0x1:
        invalid(f"member {info.filename!r} is encrypted")
    if info.compress_type not in _ZIP_METHODS:
        invalid(f"member {info.filename!r} uses an unsupported compression method")
    writer.check_declared(info.filename, info.file_size)
    # zipfile stops at the declared size; this holds whatever a reader does.
    allowance = writer.limits.expansion_allowance(info.compress_size)
    with archive.open(info) as stream:
        writer.add_file(info.filename, stream, allowance)
