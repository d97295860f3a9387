"""The digest of a version: one sha256 over its files' names, sizes and sha256s.

The registry computes it at upload and the agent recomputes it after a download, so
both must agree byte for byte: keep this canonical form stable.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

CHUNK = 1024 * 1024


def version_digest(files: Iterable[tuple[str, int, str]]) -> str:
    canonical = json.dumps(
        sorted([name, size, sha] for name, size, sha in files), separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def sha256_file(path: Path) -> tuple[int, str]:
    """(size, sha256) of a file, read in bounded chunks."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()
