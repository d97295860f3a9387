"""Decompression bombs for tests: megabytes of zeros in a few kilobytes, written in pieces
so the bomb is never held in memory."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

BOMB_BYTES = 64 << 20
_MIB_OF_ZEROS = b"\0" * (1 << 20)


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def zip_bomb(path: Path, size: int = BOMB_BYTES) -> Path:
    """One deflated member of ``size`` zero bytes (a multiple of 1 MiB)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf, zf.open("a/big.bin", "w") as out:
        for _ in range(size >> 20):
            out.write(_MIB_OF_ZEROS)
    return path


def tar_bomb(path: Path, size: int = BOMB_BYTES) -> Path:
    """A .tar.gz of one member of ``size`` zero bytes."""
    with tarfile.open(path, "w:gz") as tf:
        info = tarfile.TarInfo("a/big.bin")
        info.size = size
        tf.addfile(info, _Zeros(size))
    return path
