"""Folders and files only their owner may read: the registry's data, the agent's cache.

The registry's data folder holds ``registry.db`` (token hashes, the audit log), the
blobs and the admin token; the agent's cache holds every adapter it served. Folders are
made 0700 and files 0600 whatever the umask: ``mkdir``/``open`` with that mode (a umask
can only take bits away) and then ``chmod`` where an older run left a looser mode.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

DIR_MODE = 0o700
FILE_MODE = 0o600
# What SQLite keeps beside a database; it creates them with the database's own mode.
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) and leave it 0700; returns ``path``.

    Parents made here get the default mode: only the folder itself is the private one.
    """
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    restrict(path, DIR_MODE)
    return path


def make_dirs(path: Path) -> None:
    """``path.mkdir(parents=True, exist_ok=True)`` with every folder it makes 0700 (a
    folder inside a private one: ``mkdir``'s own ``mode`` skips the parents it makes)."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=DIR_MODE)
        except FileExistsError:
            if not folder.is_dir():
                raise


def restrict(path: Path, mode: int) -> None:
    """``chmod`` ``path`` to ``mode`` when it is looser and ours to change."""
    try:
        info = path.stat()
        if stat.S_IMODE(info.st_mode) != mode and info.st_uid == os.geteuid():
            os.chmod(path, mode)
    except FileNotFoundError:
        pass


def open_private(path: Path, *, exclusive: bool = True) -> BinaryIO:
    """Open ``path`` for writing as a new 0600 file (``exclusive``) or truncate it."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    try:
        if not exclusive:
            os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise


def write_private(path: Path, data: bytes) -> None:
    """``path.write_bytes(data)``, as a 0600 file."""
    with open_private(path, exclusive=False) as handle:
        handle.write(data)


def private_sqlite(database: Path) -> None:
    """Create the SQLite file ``database`` as 0600 before the driver does, and tighten it
    and its side files (``-wal``, ``-shm``) where an older run left them looser.

    An empty file is a valid empty database; SQLite gives its side files the database's
    mode. Nothing is done when the folder does not exist (SQLite reports that itself).
    """
    if not database.parent.is_dir():
        return
    try:
        os.close(os.open(database, os.O_WRONLY | os.O_CREAT, FILE_MODE))
    except OSError:
        return  # unwritable: SQLite says why when it opens it
    for suffix in ("", *SQLITE_SIDE_FILES):
        with contextlib.suppress(OSError):
            restrict(Path(f"{database}{suffix}"), FILE_MODE)


def read_or_create_secret(path: Path, make: Callable[[], str]) -> tuple[str, bool]:
    """The secret kept in ``path`` (mode 0600) and whether it was made now: ``make()``
    written at first use, read (stripped) after. The file appears whole or not at all
    (written aside, then linked in place), and two processes making it at once end with
    the same secret: the second link fails and that one reads the first one's."""
    with contextlib.suppress(FileNotFoundError):
        if secret := path.read_text().strip():
            return secret, False
    secret = make()
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open_private(tmp) as handle:
        handle.write((secret + "\n").encode())
    try:
        os.link(tmp, path)
    except FileExistsError:
        if not (found := path.read_text().strip()):
            os.replace(tmp, path)  # an empty file is no secret: this one takes its place
            return secret, True
        return found, False
    finally:
        tmp.unlink(missing_ok=True)
    return secret, True
