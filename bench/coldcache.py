"""What "cold" can mean on this machine: a private Postgres cluster the benchmark may
restart (its shared_buffers empty), and the kernel page cache emptied file by file.

The machine's shared Postgres serves other work, so it is never restarted; the history
benchmark runs its own cluster (``initdb`` as the ``postgres`` user, trust auth, a
free port, default settings) in a temporary folder. ``evict`` writes a file's dirty
pages back and asks the kernel to drop its cached pages (``posix_fadvise``
``DONTNEED``), which needs no privilege beyond opening the file and leaves the rest of
the machine's cache alone (``echo 3 > /proc/sys/vm/drop_caches`` would empty every
other process's cache too). ``resident_bytes`` counts what is still cached
(``mincore`` through ``fincore``) so a run shows that the eviction happened. The
virtual disk below may still be cached by the host; ``random_read_ms`` measures what
an uncached 8 KiB read costs here, so "cold" is a measured number, not a label.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from loraplane.netutil import free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_USER = "postgres"
BLOCK = 8192


def _files(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from (p for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            yield path


def evict(paths: Iterable[Path]) -> int:
    """Drop the page-cache pages of every file under ``paths``; the files it touched."""
    count = 0
    for path in _files(paths):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # removed meanwhile (a WAL segment recycled)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            count += 1
        finally:
            os.close(fd)
    return count


def resident_bytes(paths: Iterable[Path]) -> int | None:
    """Bytes of these files in the page cache (``fincore``), or None without it."""
    fincore = shutil.which("fincore")
    files = [str(p) for p in _files(paths)]
    if fincore is None or not files:
        return None if fincore is None else 0
    total = 0
    for start in range(0, len(files), 500):
        out = subprocess.run([fincore, "--bytes", "--noheadings", "--raw", "-o", "RES",
                              *files[start:start + 500]],
                             check=True, capture_output=True, text=True).stdout
        total += sum(int(line) for line in out.split())
    return total


def random_read_ms(path: Path, reads: int = 200, seed: int = 7) -> list[float]:
    """Latency of 8 KiB reads at random offsets of ``path`` after evicting it."""
    evict([path])
    size = path.stat().st_size
    rng = random.Random(seed)
    times: list[float] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(reads):
            offset = rng.randrange(0, max(1, size // BLOCK)) * BLOCK
            t0 = time.perf_counter()
            os.pread(fd, BLOCK, offset)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
    return times


class PrivatePostgres:
    """A Postgres 15 cluster of the benchmark's own, restartable at will."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "pgdata"
        self.sockets = root / "sockets"
        self.port = free_port()
        self.log = root / "postgres.log"

    @property
    def url(self) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/postgres"

    @property
    def async_url(self) -> str:
        return self.url.replace("postgresql://", "postgresql+asyncpg://", 1)

    def _run(self, *argv: str) -> None:
        done = subprocess.run(["runuser", "-u", PG_USER, "--", *argv], check=False,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): "
                               f"{done.stderr.strip() or done.stdout.strip()}")

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.sockets.mkdir(exist_ok=True)
        shutil.chown(self.root, PG_USER, PG_USER)
        shutil.chown(self.sockets, PG_USER, PG_USER)
        self._run(str(PG_BIN / "initdb"), "-D", str(self.data), "--auth=trust",
                  "--username", PG_USER, "--encoding=UTF8", "--no-sync")
        self.start()

    def start(self) -> None:
        options = f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1"
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                  "-o", options, "-w", "start")

    def stop(self) -> None:
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def restart_cold(self) -> int | None:
        """Stop (a checkpoint: nothing dirty), empty the page cache of its files, start.

        Returns the bytes of the cluster's files still cached after the eviction."""
        self.stop()
        evict([self.data])
        left = resident_bytes([self.data / "base"])
        self.start()
        return left

    def relation_file(self, relfilepath: str) -> Path:
        return self.data / relfilepath

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError):  # not running
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def private_postgres(root: Path) -> Iterator[PrivatePostgres]:
    cluster = PrivatePostgres(root)
    try:
        cluster.init()
        yield cluster
    finally:
        cluster.destroy()
