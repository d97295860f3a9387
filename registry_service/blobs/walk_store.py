"""The local store's walks, run by a child process: the listing (one line per blob
file, ``<sha256 hex> <mtime in ns>``) and the sweep of old temporary files (the number
removed).

Run as a script (``python -I walk_store.py list|sweep ROOT [OLDER_THAN_S]``), it imports
nothing of loraplane, so
it starts in tens of ms. Walking millions of files is CPU work; done in the registry's
own process it would hold the GIL the event loop needs. In a process of its own, at a
lower priority, the operating system shares the cores instead, and the pipe's back
pressure keeps the walk one buffer ahead of the collector.
Why: docs/decisions.md#the-local-store-is-listed-by-a-child-process
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import stat
import sys
import time
from collections.abc import Iterator

# The store's names, shared with the registry (which imports them from here).
SHA256_RE = re.compile(r"[0-9a-f]{64}")
TEMP_SUFFIX = ".tmp"
NICENESS = 10


def _scan(directory: str) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            yield from entries
    except (FileNotFoundError, NotADirectoryError):
        return


def shard_dirs(root: str) -> Iterator[str]:
    """Every ``root/sha256/<ab>/<cd>`` directory, found as the walk goes."""
    for top in _scan(os.path.join(root, "sha256")):
        if top.is_dir(follow_symlinks=False):
            for shard in _scan(top.path):
                if shard.is_dir(follow_symlinks=False):
                    yield shard.path


def blob_lines(root: str) -> Iterator[bytes]:
    """A line per regular file named by a bare digest (temporary files start with a
    dot and never match)."""
    for shard in shard_dirs(root):
        for entry in _scan(shard):
            if len(entry.name) != 64 or not SHA256_RE.fullmatch(entry.name):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(info.st_mode):
                yield b"%s %d\n" % (entry.name.encode(), info.st_mtime_ns)


def remove_stale_tmp(root: str, older_than_s: float) -> int:
    """Remove the temporary files older than ``older_than_s`` where the store writes
    them: its root (streamed uploads) and its shard directories (blobs being put)."""
    cutoff = time.time() - older_than_s
    removed = 0
    for directory in itertools.chain((root,), shard_dirs(root)):
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


def main(argv: list[str]) -> int:
    usage = "usage: walk_store.py list ROOT | sweep ROOT OLDER_THAN_S"
    if len(argv) < 3 or (argv[1], len(argv)) not in {("list", 3), ("sweep", 4)}:
        print(usage, file=sys.stderr)
        return 2
    # Without nice() (not Unix), the walk runs at the registry's priority.
    with contextlib.suppress(AttributeError, OSError):
        os.nice(NICENESS)
    out = sys.stdout.buffer
    if argv[1] == "sweep":
        out.write(b"%d\n" % remove_stale_tmp(argv[2], float(argv[3])))
    else:
        for line in blob_lines(argv[2]):
            out.write(line)
    out.flush()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except BrokenPipeError:
        sys.exit(1)  # the registry stopped reading (a pass cancelled)
