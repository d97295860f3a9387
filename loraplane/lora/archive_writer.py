"""The part of archive extraction that touches the disk: member names checked and
normalised, regular files written by this module alone, and every limit (members, file
and total sizes, expansion ratio) counted on the bytes actually decompressed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NoReturn

from loraplane.lora.errors import AdapterInvalid

CHUNK_BYTES = 1024 * 1024
MAX_NAME_CHARS = 1024
MAX_NAME_DEPTH = 32
MAX_COMPONENT_BYTES = 255
# Default cap on decompressed bytes per compressed byte. Adapter weights are floats and
# barely compress (an untrained adapter's zero lora_B halves its size at most); a
# deflate bomb reaches about 1,000.
DEFAULT_MAX_EXPANSION_RATIO = 100.0
# Expansion up to this many bytes is never judged by ratio: tiny files compress oddly.
RATIO_FLOOR_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Limits:
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


def unsafe(message: str, name: str) -> NoReturn:
    printable = name.encode("utf-8", "backslashreplace").decode("utf-8")
    raise AdapterInvalid("unsafe_archive", message, {"member": printable})


def invalid(message: str) -> NoReturn:
    raise AdapterInvalid("invalid_archive", message)


def normalize(name: str, *, is_dir: bool) -> tuple[str, ...]:
    if any(ch in name for ch in "\\\x00") or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
        unsafe("member name contains a backslash or control character", name)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        unsafe("member name is not valid UTF-8", name)
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        unsafe(f"absolute member path {name!r}", name)
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        unsafe(f"member path {name!r} contains '..'", name)
    if len(name) > MAX_NAME_CHARS or len(parts) > MAX_NAME_DEPTH:
        unsafe("member path is too long or too deep", name)
    if any(len(p.encode("utf-8")) > MAX_COMPONENT_BYTES for p in parts):
        unsafe("member path has a component longer than 255 bytes", name)
    if not parts and not is_dir:
        unsafe("file member has an empty name", name)
    return parts


class Writer:
    """Writes regular files under ``root`` while enforcing the limits."""

    def __init__(self, root: Path, limits: Limits, allowance: int | None = None) -> None:
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
            unsafe(f"duplicate member name {key!r}", name)
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts))]
        if any(p in self._file_keys for p in prefixes) or (key in self._file_keys):
            unsafe(f"member {key!r} conflicts with a file of the same name", name)
        if not is_dir and key in self._dir_keys:
            unsafe(f"file {key!r} conflicts with a directory of the same name", name)
        self._seen.add(key)
        self._dir_keys.update(prefixes)
        (self._dir_keys if is_dir else self._file_keys).add(key)

    def add_dir(self, name: str) -> None:
        parts = normalize(name, is_dir=True)
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
        parts = normalize(name, is_dir=False)
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
