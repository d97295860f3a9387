"""A ``VersionRef`` becomes a validated adapter folder in the local disk cache.

Layout: ``cache_dir/<adapter>/<version>-<digest12>/``. A folder there is complete and
validated by construction: files are fetched into ``cache_dir/.staging/``, checked
(size and sha256 per file, the version digest, then ``validate_adapter_dir`` with the
base model's shapes and vLLM's ``max_lora_rank``) and only then renamed into place in
one step. A crash leaves at most a staging folder, which the next start removes.

Each file is hashed once, while it is written: the fetch (or the watch dir's copy)
returns the size and sha256 of the bytes it wrote, and the check compares those. A
second read of every file would cost as much again for a large adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

from inference_agent.errors import AdapterRejected, AgentError, FetchFailed, TerminalError
from inference_agent.metrics import AgentMetrics
from loraplane.digest import version_digest
from loraplane.events import FileRef, VersionRef
from loraplane.lora import AdapterInvalid, BaseModelShapes, validate_adapter_dir
from loraplane.naming import versioned_name
from loraplane.private_files import DIR_MODE, make_dirs, open_private, private_dir

log = logging.getLogger(__name__)

# Writes ``file`` to the path and returns (size, sha256) of the bytes it wrote.
Fetch = Callable[[FileRef, Path], Awaitable[tuple[int, str]]]
Written = list[tuple[str, int, str]]  # (name, size, sha256) per file, as written
Fill = Callable[[VersionRef, Path], Awaitable[Written]]
STAGING = ".staging"
COPY_CHUNK = 1 << 20
# Versions up to this size are checked on the event loop: the check (a NaN/Inf scan at
# hundreds of MB/s) costs less than handing it to a worker thread and back (two more
# wake-ups on a crowded host).
INLINE_CHECK_BYTES = 1 << 20


@dataclass(frozen=True)
class CachedFolder:
    name: str  # versioned name, adapter@N
    path: Path
    size: int
    mtime: float


def folder_name(ref: VersionRef) -> str:
    return f"{ref.version}-{ref.digest[:12]}"


def _safe_file_name(name: str) -> bool:
    # Names come from the registry, but they become paths here: no separators, no dots.
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")


def _rename_into_place(staging: Path, final: Path, attempts: int = 3) -> None:
    """Rename ``staging`` to ``final``, making its adapter folder first.

    The disk cache's eviction removes empty adapter folders in a worker thread, so the
    folder made here can vanish before the rename, which then fails with ENOENT (seen when
    a hundred agents start at once). The folder is made again and the rename retried; a
    staging folder that is really gone still raises."""
    for attempt in range(attempts):
        make_dirs(final.parent)
        try:
            os.rename(staging, final)
            return
        except FileNotFoundError:
            if attempt == attempts - 1 or not staging.is_dir():
                raise


def _rejected(ref: VersionRef, code: str, message: str,
              detail: dict[str, object] | None = None) -> AdapterRejected:
    return AdapterRejected(f"{versioned_name(ref.adapter, ref.version)}: {message}",
                           code=code, detail={"adapter": ref.adapter,
                                              "version": ref.version, **(detail or {})})


def _versions_in(adapter_dir: str) -> list[int]:
    """The version numbers of the folders in one adapter's folder (``<N>-<digest>``)."""
    try:
        with os.scandir(adapter_dir) as folders:
            return [int(number) for folder in folders
                    if (number := folder.name.partition("-")[0]).isdigit()
                    and folder.is_dir()]
    except FileNotFoundError:  # evicted, in a worker thread, since it was listed
        return []


class Materializer:
    """Fetches, verifies and validates versions into the disk cache; evicts by LRU."""

    def __init__(self, cache_dir: Path, *, max_bytes: int, fetch: Fetch | None,
                 base_shapes: BaseModelShapes | None, max_rank: int,
                 metrics: AgentMetrics) -> None:
        self.cache_dir = cache_dir
        self.max_bytes = max_bytes
        self._fetch = fetch
        self.base_shapes = base_shapes
        self.max_rank = max_rank
        self._metrics = metrics
        self._locks: dict[Path, asyncio.Lock] = {}
        self._users: dict[Path, int] = {}
        # Bytes on disk as of the last walk plus the folders built since (None: not
        # walked yet), so that an eviction check under budget costs no walk. Written
        # on the event loop only.
        self._bytes: int | None = None
        # While a walk runs: the folders built meanwhile, which it may not have seen.
        self._built_in_walk: list[tuple[Path, int]] | None = None
        self._walking = asyncio.Lock()  # one walk at a time, so one list of those
        # on_disk's answer, kept up to date by the folders built here and replaced by
        # each walk's list (None: not listed yet, or a walk failed; listed at the next call).
        self._listed: set[tuple[str, int]] | None = None
        # Every adapter this agent served: for its user only (0700, files 0600).
        private_dir(cache_dir)
        # Leftovers of a crash mid-fetch: never complete, never referenced.
        shutil.rmtree(cache_dir / STAGING, ignore_errors=True)

    def folder_for(self, ref: VersionRef) -> Path:
        return self.cache_dir / ref.adapter / folder_name(ref)

    def on_disk(self) -> AbstractSet[tuple[str, int]]:
        """(adapter, version) of every folder on disk: the warm tier (and the hot).

        The status report reads this on every build, on every agent at every push: the
        folders are listed once, then the list follows the folders built here, and is
        replaced by each walk of the cache (``evict_disk``: over budget, or a recount,
        on a worker thread; a folder removed by hand shows until then)."""
        if self._listed is None:
            self._listed = self._list_folders()
        return self._listed

    def _list_folders(self) -> set[tuple[str, int]]:
        # Names only, no sizes. scandir's entries know their type from the directory
        # listing; Path.is_dir would make a stat call per folder.
        found: set[tuple[str, int]] = set()
        with os.scandir(self.cache_dir) as adapters:
            for adapter_dir in adapters:
                if adapter_dir.name != STAGING and adapter_dir.is_dir():
                    found.update((adapter_dir.name, n) for n in _versions_in(adapter_dir.path))
        return found

    def path_of(self, ref: VersionRef) -> Path | None:
        folder = self.folder_for(ref)
        return folder if folder.is_dir() else None

    async def materialize(self, ref: VersionRef) -> Path:
        """The validated folder of ``ref``, fetching it first if it is not on disk."""
        return await self._produce(ref, self._fetch_into)

    async def add_local(self, ref: VersionRef, source_dir: Path) -> Path:
        """Like ``materialize`` but copies ``ref.files`` from ``source_dir`` (--watch-dir)."""
        async def copy(_ref: VersionRef, staging: Path) -> Written:
            return await asyncio.to_thread(self._copy_files, ref, source_dir, staging)
        return await self._produce(ref, copy)

    async def _produce(self, ref: VersionRef, fill: Fill) -> Path:
        final = self.folder_for(ref)
        lock = self._locks.setdefault(final, asyncio.Lock())
        self._users[final] = self._users.get(final, 0) + 1
        try:
            async with lock:  # one fetch per folder; the others find it done
                if final.is_dir():
                    os.utime(final)  # mtime is the disk cache's LRU clock
                    return final
                self.precheck(ref)
                started = time.perf_counter()
                await self._build(ref, final, fill)
                self._metrics.tier_transition("cold", "warm", time.perf_counter() - started)
                return final
        finally:
            self._users[final] -= 1
            if not self._users[final]:
                del self._users[final], self._locks[final]

    def precheck(self, ref: VersionRef) -> None:
        """Refuse (and count) what needs no download to refuse: a rank above vLLM's
        maximum, unsafe or repeated file names. A version left cold gets only these."""
        try:
            self._precheck(ref)
        except AgentError as exc:
            self._metrics.count_failure(ref.adapter, exc)
            raise

    def _precheck(self, ref: VersionRef) -> None:
        if ref.rank > self.max_rank:
            raise _rejected(ref, "rank_too_large",
                            f"adapter rank {ref.rank} is above the maximum {self.max_rank}",
                            {"rank": ref.rank, "max_rank": self.max_rank})
        bad = [f.name for f in ref.files if not _safe_file_name(f.name)]
        if bad or len({f.name for f in ref.files}) != len(ref.files):
            raise _rejected(ref, "unsafe_file_name",
                            f"file names {bad or [f.name for f in ref.files]} are not safe",
                            {"files": bad})

    async def _build(self, ref: VersionRef, final: Path, fill: Fill) -> None:
        staging = self.cache_dir / STAGING / f"{ref.adapter}-{ref.version}-{uuid.uuid4().hex}"
        make_dirs(staging.parent)
        staging.mkdir(mode=DIR_MODE)
        try:
            with self._metrics.stage("fetch"):
                written = await fill(ref, staging)
            with self._metrics.stage("validate"):
                if sum(f.size for f in ref.files) <= INLINE_CHECK_BYTES:
                    self._check(ref, staging, written)
                else:
                    await asyncio.to_thread(self._check, ref, staging, written)
            _rename_into_place(staging, final)
            os.utime(final)
            if self._listed is not None:
                self._listed.add((ref.adapter, ref.version))
            size = sum(f.size for f in ref.files)
            if self._bytes is not None:
                self._bytes += size
            if self._built_in_walk is not None:
                self._built_in_walk.append((final, size))
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, AgentError):
                self._metrics.count_failure(ref.adapter, exc)
            raise
        log.info("materialized %s into %s", versioned_name(ref.adapter, ref.version), final)

    async def _fetch_into(self, ref: VersionRef, staging: Path) -> Written:
        if self._fetch is None:
            raise TerminalError(f"{versioned_name(ref.adapter, ref.version)} is not on disk "
                                "and this agent has no registry to fetch it from",
                                code="no_source")
        written: Written = []
        for file in ref.files:
            written.append((file.name, *await self._fetch(file, staging / file.name)))
        return written

    @staticmethod
    def _copy_files(ref: VersionRef, source_dir: Path, staging: Path) -> Written:
        written: Written = []
        for file in ref.files:
            source = source_dir / file.name
            if not source.is_file() or source.is_symlink():
                raise FetchFailed(f"{source} is missing or not a regular file",
                                  detail={"path": str(source)})
            written.append((file.name, *_copy_hashed(source, staging / file.name)))
        return written

    def _check(self, ref: VersionRef, staging: Path, written: Written) -> None:
        """Compare what was written (sizes, sha256s) with ``ref``, check the digest, then
        validate the files; in a worker thread unless the version is small."""
        actual: list[tuple[str, int, str]] = []
        for file, (_name, size, sha) in zip(ref.files, written, strict=True):
            if (size, sha) != (file.size, file.sha256):
                raise FetchFailed(
                    f"{file.name}: got {size} bytes with sha256 {sha}, expected "
                    f"{file.size} bytes with sha256 {file.sha256}",
                    detail={"file": file.name, "size": size, "sha256": sha})
            actual.append((file.name, size, sha))
        digest = version_digest(actual)
        if digest != ref.digest:
            raise _rejected(ref, "digest_mismatch",
                            f"the files' digest {digest} is not the version's {ref.digest}",
                            {"digest": digest, "expected_digest": ref.digest})
        try:
            validate_adapter_dir(staging, max_rank=self.max_rank, base_shapes=self.base_shapes)
        except AdapterInvalid as exc:
            raise _rejected(ref, exc.code, exc.message, dict(exc.detail)) from exc

    # disk cache

    def cached(self) -> list[CachedFolder]:
        """Every complete folder in the cache, oldest first."""
        found: list[CachedFolder] = []
        for adapter_dir in self.cache_dir.iterdir():
            if adapter_dir.name == STAGING or not adapter_dir.is_dir():
                continue
            for folder in adapter_dir.iterdir():
                version, _, _digest = folder.name.partition("-")
                if not version.isdigit() or not folder.is_dir():
                    continue
                size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
                found.append(CachedFolder(versioned_name(adapter_dir.name, int(version)),
                                          folder, size, folder.stat().st_mtime))
        return sorted(found, key=lambda f: f.mtime)

    async def evict_disk(self, keep: set[str], *, recount: bool = False) -> None:
        """Remove least recently used folders until the cache fits ``max_bytes``.

        Folders whose versioned name is in ``keep`` (loaded, routed) and folders being
        materialized right now are never removed, even if the cache stays over budget.

        It runs after every flip and drain: under budget by the running count, it
        returns without walking the folders (a stat of every file; why:
        docs/decisions.md#the-disk-cache-is-walked-only-when-over-budget). The count is
        kept exact for the folders built here, those built while a walk runs included;
        ``recount`` walks anyway, to see what changed on disk by other hands (the
        periodic resync asks for it, off the path of a push).
        """
        if not recount and self._bytes is not None and self._bytes <= self.max_bytes:
            return
        async with self._walking:
            busy = set(self._locks)
            built: list[tuple[Path, int]] = []
            self._built_in_walk = built
            try:
                total, seen, left = await asyncio.to_thread(self._evict, keep, busy)
            except BaseException:
                self._listed = None
                raise
            finally:
                self._built_in_walk = None
            # A folder built meanwhile was added to the count this walk replaces.
            self._bytes = total + sum(size for path, size in built
                                      if path not in seen and path.is_dir())
            # ``on_disk`` answers from this walk (made on a worker thread) and what was
            # built meanwhile: listing thousands of folders again on the loop would hold
            # it at the next report.
            self._listed = left | {_listed_as(path) for path, _size in built}

    def _evict(self, keep: set[str], busy: set[Path]
               ) -> tuple[int, set[Path], set[tuple[str, int]]]:
        """Evict down to ``max_bytes``: the bytes left on disk, the folders seen, and
        (adapter, version) of those left."""
        folders = self.cached()
        total = sum(f.size for f in folders)
        removed: set[Path] = set()
        for folder in folders:
            if total <= self.max_bytes:
                break
            if folder.name in keep or folder.path in busy:
                continue
            started = time.perf_counter()
            shutil.rmtree(folder.path, ignore_errors=True)
            removed.add(folder.path)
            self._metrics.tier_transition("warm", "cold", time.perf_counter() - started)
            total -= folder.size
            log.info("disk cache: removed %s (%d bytes)", folder.path, folder.size)
        for adapter_dir in self.cache_dir.iterdir():
            if adapter_dir.name != STAGING and adapter_dir.is_dir():
                with contextlib.suppress(OSError):
                    adapter_dir.rmdir()  # only succeeds when empty
        left = {_listed_as(f.path) for f in folders if f.path not in removed}
        return total, {folder.path for folder in folders}, left


def _listed_as(folder: Path) -> tuple[str, int]:
    """(adapter, version) of a complete folder ``<cache>/<adapter>/<N>-<digest>``."""
    return folder.parent.name, int(folder.name.partition("-")[0])


def _copy_hashed(source: Path, dest: Path) -> tuple[int, str]:
    """Copy ``source`` to ``dest``; (size, sha256) of the bytes copied. The watch dir's
    folder may change meanwhile: what is checked is what was copied, not the source."""
    digest, size = hashlib.sha256(), 0
    with source.open("rb") as src, open_private(dest, exclusive=False) as out:
        while chunk := src.read(COPY_CHUNK):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
    return size, digest.hexdigest()
