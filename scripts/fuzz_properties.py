"""The properties the fuzzer checks, one function per target, independent of atheris.

Each ``check_*`` takes one input and raises :class:`PropertyViolation` (or lets any
non-domain exception through) when the component misbehaves; a refusal with
:class:`AdapterInvalid` is a correct answer. The function under test is a parameter,
so the tests can hand in a broken one and see that the check notices.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loraplane.lora import AdapterInvalid, extract_archive, read_header, scan_finite
from loraplane.lora.errors import ERROR_CODES
from loraplane.lora.safetensors import DTYPE_BITS, SafetensorsHeader

MAX_HEADER_BYTES = 4096
ARCHIVE_LIMITS: dict[str, int] = {
    "max_total_bytes": 256 * 1024,
    "max_members": 16,
    "max_file_bytes": 128 * 1024,
}

HeaderReader = Callable[..., SafetensorsHeader]
Extractor = Callable[..., list[Path]]


class PropertyViolation(AssertionError):
    """The component answered, but not as its contract says."""


def _check_refusal(exc: AdapterInvalid) -> None:
    if exc.code not in ERROR_CODES:
        raise PropertyViolation(f"refusal with an undeclared code {exc.code!r}")
    json.dumps(exc.to_dict())  # the registry sends it back as JSON
    str(exc)


def check_safetensors(path: Path, data: bytes, reader: HeaderReader = read_header) -> None:
    """``data`` parses into a header that describes it exactly, or is refused."""
    path.write_bytes(data)
    try:
        header = reader(path, max_header_bytes=MAX_HEADER_BYTES)
        _check_header(header, len(data))
        scan_finite(path, header, chunk_bytes=64)
    except AdapterInvalid as exc:
        _check_refusal(exc)


def _check_header(header: SafetensorsHeader, file_size: int) -> None:
    if not 10 <= header.data_start <= 8 + MAX_HEADER_BYTES:
        raise PropertyViolation(f"data section starts at {header.data_start}")
    position = 0
    for info in sorted(header.tensors.values(), key=lambda t: t.begin):
        if info.begin != position or info.end < info.begin:
            raise PropertyViolation(f"tensor {info.name!r} does not tile the data section")
        if info.numel * DTYPE_BITS[info.dtype] != 8 * info.nbytes:
            raise PropertyViolation(f"tensor {info.name!r} shape disagrees with its span")
        position = info.end
    if header.data_start + position != file_size:
        raise PropertyViolation("tensors do not cover the file exactly")
    if not all(isinstance(v, str) for v in header.metadata.values()):
        raise PropertyViolation("metadata holds a non-string value")


class _WriteWatch:
    """Records every filesystem change Python makes outside ``allowed`` while armed.

    Python's audit hooks see each open for writing, mkdir, rename, link and removal,
    whichever library makes it; paths relative to a directory descriptor are resolved
    through /proc. Hooks cannot be removed, so one watch is installed per process.
    """

    # event -> (argument index of a path, index of its dir_fd or None), per path it changes
    _WRITE_EVENTS: dict[str, tuple[tuple[int, int | None], ...]] = {
        "os.mkdir": ((0, 2),), "os.rename": ((0, 2), (1, 3)), "os.symlink": ((1, 2),),
        "os.link": ((1, 3),), "os.remove": ((0, 1),), "os.rmdir": ((0, 1),),
        "os.chmod": ((0, 2),), "os.chown": ((0, 3),), "os.truncate": ((0, None),),
        "os.utime": ((0, 3),), "shutil.rmtree": ((0, 1),),
    }  # fmt: skip
    _WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def __init__(self) -> None:
        self.allowed: Path | None = None
        self.violations: list[str] = []
        sys.addaudithook(self._hook)

    @contextmanager
    def armed(self, allowed: Path) -> Iterator[list[str]]:
        self.allowed, self.violations = allowed.resolve(), []
        try:
            yield self.violations
        finally:
            self.allowed = None

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self.allowed is None:
            return
        if event == "open":
            path, mode, flags = args
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & self._WRITE_FLAGS)
            if writes and path is not None and not isinstance(path, int):
                self._judge(event, path, None)
            return
        for where, fd_at in self._WRITE_EVENTS.get(event, ()):
            dir_fd = args[fd_at] if fd_at is not None and fd_at < len(args) else None
            if not isinstance(args[where], int):
                self._judge(event, args[where], dir_fd)

    def _judge(self, event: str, path: Any, dir_fd: Any) -> None:
        assert self.allowed is not None
        target = Path(os.fsdecode(path))
        if isinstance(dir_fd, int) and not target.is_absolute():
            target = Path(os.readlink(f"/proc/self/fd/{dir_fd}")) / target
        resolved = Path(os.path.abspath(target))
        if resolved != self.allowed and not resolved.is_relative_to(self.allowed):
            self.violations.append(f"{event} {resolved}")


@functools.cache
def _watch() -> _WriteWatch:
    return _WriteWatch()


def check_archive(work: Path, data: bytes, extract: Extractor = extract_archive) -> None:
    """``data`` extracts into ``dest`` only, or is refused leaving ``dest`` empty.

    The registry extracts into an empty folder it made; the CLI-style caller passes a
    path that does not exist yet. Inputs of odd length take the second path, so both
    are fuzzed and each input is replayed the same way.
    """
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    src, dest = work / "upload.bin", work / "out"
    src.write_bytes(data)
    existed = len(data) % 2 == 0
    if existed:
        dest.mkdir()
    try:
        with _watch().armed(dest) as violations:
            try:
                paths = extract(src, dest, **ARCHIVE_LIMITS)
            except AdapterInvalid as exc:
                _check_refusal(exc)
                paths = None
        if violations:
            raise PropertyViolation("wrote outside the target: " + "; ".join(violations[:5]))
        if paths is None:
            _check_refused(dest, existed=existed)
        else:
            _check_extracted(dest, paths)
        if sorted(p.name for p in work.iterdir()) not in (["out", "upload.bin"], ["upload.bin"]):
            raise PropertyViolation(f"left files beside the target: {sorted(work.iterdir())}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_refused(dest: Path, *, existed: bool) -> None:
    if existed and (not dest.is_dir() or any(dest.iterdir())):
        raise PropertyViolation(f"a refusal left files behind: {sorted(dest.rglob('*'))}")
    if not existed and dest.exists():
        raise PropertyViolation("a refusal left the target folder it created")


def _check_extracted(dest: Path, paths: list[Path]) -> None:
    root = dest.resolve()
    on_disk = {p for p in dest.rglob("*") if not p.is_dir() or p.is_symlink()}
    if set(paths) != on_disk:
        raise PropertyViolation(f"returned {sorted(paths)} but wrote {sorted(on_disk)}")
    total = 0
    for path in paths:
        mode = path.lstat().st_mode
        if not stat.S_ISREG(mode) or not path.resolve().is_relative_to(root):
            raise PropertyViolation(f"{path} is not a regular file inside the target")
        if mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IWOTH) or path.lstat().st_nlink != 1:
            raise PropertyViolation(f"{path} kept permissions or links from the archive")
        size = path.stat().st_size
        if size > ARCHIVE_LIMITS["max_file_bytes"]:
            raise PropertyViolation(f"{path} is over the file size limit")
        total += size
    if total > ARCHIVE_LIMITS["max_total_bytes"]:
        raise PropertyViolation("the files add up to more than the total limit")
