"""``--watch-dir DIR``: adapters from a local folder, for development and air-gapped hosts.

Every ``DIR/<adapter>/`` holding ``adapter_config.json`` and
``adapter_model.safetensors`` is served as ``<adapter>`` (alias ``live``). When its
files change, the folder becomes a new local version that goes the same way as a
registry version: copied and validated into the disk cache, loaded under
``adapter@N``, flipped, the old version drained. A folder that fails leaves the previous
version serving and is reported with the reason; a removed folder removes the alias.

Version numbers are monotonic per adapter and persisted under the cache dir with the
digest they were given to, so a restart never puts other weights under a used name.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import watchfiles

from inference_agent.errors import AdapterRejected, AgentError
from inference_agent.reconciler import AliasApplier, VersionFailure
from inference_agent.routing import RouteTable
from inference_agent.workqueue import Done, Failed, Outcome, Retry, WorkQueue
from loraplane.digest import sha256_file, version_digest
from loraplane.events import FileRef, VersionRef
from loraplane.lora import ALLOWED_FILES, CONFIG_FILE, AdapterInvalid, parse_lora_config
from loraplane.naming import DEFAULT_ALIAS, is_slug

log = logging.getLogger(__name__)

STATE_FILE = "local-versions.json"
ALIAS = DEFAULT_ALIAS


class LocalCopier(Protocol):
    async def add_local(self, ref: VersionRef, source_dir: Path) -> Path: ...


class LocalVersions:
    """Version numbers given to local folders, persisted as JSON: adapter -> digest -> N."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._numbers: dict[str, dict[str, int]] = {}
        try:
            raw = json.loads(path.read_text())
            self._numbers = {a: {d: int(n) for d, n in v.items()} for a, v in raw.items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            # Refusing to start would be worse; numbers then restart above what the
            # cache and the route table still show (see ``number``).
            log.warning("ignoring unreadable %s: %s", path, exc)

    def number(self, adapter: str, digest: str, floor: int) -> int:
        """The number of ``digest`` for ``adapter``: its old one, or a new one above
        every number used so far and above ``floor``."""
        given = self._numbers.setdefault(adapter, {})
        if digest in given:
            return given[digest]
        number = max([floor, *given.values()]) + 1
        given[digest] = number
        self._save()
        return number

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._numbers, indent=1, sort_keys=True))
        os.replace(tmp, self.path)


def hash_folder(folder: Path) -> list[tuple[str, int, str]]:
    """(name, size, sha256) of the adapter files present in ``folder``."""
    return [(name, *sha256_file(folder / name)) for name in ALLOWED_FILES
            if (folder / name).is_file()]


def local_ref(adapter: str, version: int, folder: Path, base_model: str,
              files: list[tuple[str, int, str]]) -> VersionRef:
    """The VersionRef of a local folder; AdapterRejected if its config is unusable."""
    names = {name for name, _size, _sha in files}
    missing = [name for name in ALLOWED_FILES if name not in names]
    if missing:
        raise AdapterRejected(f"{folder}: missing {', '.join(missing)}", code="missing_files")
    try:
        config = parse_lora_config(folder / CONFIG_FILE)
    except AdapterInvalid as exc:
        raise AdapterRejected(f"{folder}: {exc}", code=exc.code) from exc
    targets = config.target_modules
    return VersionRef(
        adapter=adapter, version=version, digest=version_digest(files), base_model=base_model,
        rank=config.max_rank, alpha=config.lora_alpha,
        target_modules=[targets] if isinstance(targets, str) else list(targets),
        files=[FileRef(name=name, size=size, sha256=sha, url=(folder / name).as_uri())
               for name, size, sha in files])


class Watcher:
    """Serves the adapters of one folder; ``owns(name)`` tells the reconciler to keep off."""

    def __init__(self, watch_dir: Path, *, base_model: str, routes: RouteTable,
                 swapper: AliasApplier, materializer: LocalCopier, state_dir: Path,
                 known_versions: Callable[[str], int] | None = None,
                 debounce_ms: int = 1000, on_change: Callable[[], None] | None = None,
                 queue: WorkQueue[str] | None = None) -> None:
        self.watch_dir = watch_dir.resolve()
        self.base_model = base_model
        self._routes = routes
        self._swapper = swapper
        self._materializer = materializer
        self._numbers = LocalVersions(state_dir / STATE_FILE)
        self._known_versions = known_versions or (lambda _adapter: 0)
        self.debounce_ms = debounce_ms
        self._on_change = on_change or (lambda: None)
        self.queue: WorkQueue[str] = queue or WorkQueue(name="watch")
        self._owned: set[str] = set()
        self._failures: dict[str, VersionFailure] = {}
        self._pending: dict[tuple[str, str], int | None] = {}

    # --- views --------------------------------------------------------------------------

    def owns(self, adapter: str) -> bool:
        return adapter in self._owned

    def failures(self) -> list[VersionFailure]:
        return [self._failures[a] for a in sorted(self._failures)]

    def pending(self) -> dict[tuple[str, str], int | None]:
        return dict(self._pending)

    # --- running ------------------------------------------------------------------------

    def scan(self) -> set[str]:
        """Queue every adapter folder there is now; returns their names."""
        found = set()
        for entry in sorted(self.watch_dir.iterdir()):
            if entry.is_dir() and not entry.name.startswith("."):
                if is_slug(entry.name):
                    found.add(entry.name)
                else:
                    log.warning("watch dir: %s is not an adapter name (a slug); skipped",
                                entry.name)
        # Owned from the start, so the reconciler never touches a local adapter.
        self._owned |= found
        for name in sorted(found):
            self.queue.add(name)
        return found

    async def run(self, workers: int = 2) -> None:
        """Apply folders as they change, until cancelled (call ``scan`` first)."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.queue.run(self.sync, workers), name="watch-workers")
            group.create_task(self._watch(), name="watch-events")

    async def _watch(self) -> None:
        async for changes in watchfiles.awatch(self.watch_dir, debounce=self.debounce_ms,
                                               recursive=True):
            for _change, raw in changes:
                adapter = self._adapter_of(Path(raw))
                if adapter is not None:
                    self.queue.add(adapter)

    def _adapter_of(self, path: Path) -> str | None:
        try:
            parts = path.resolve().relative_to(self.watch_dir).parts
        except ValueError:
            return None
        if not parts or parts[0].startswith(".") or not is_slug(parts[0]):
            return None
        return parts[0]

    # --- one adapter ----------------------------------------------------------------------

    async def sync(self, adapter: str) -> Outcome:
        """Make what ``adapter`` serves match its folder (the work-queue handler)."""
        folder = self.watch_dir / adapter
        if not folder.is_dir():
            return await self._remove(adapter)
        self._owned.add(adapter)
        files = await asyncio.to_thread(hash_folder, folder)
        digest = version_digest(files)
        revision, current = self._routes.alias(adapter, ALIAS)
        if current is not None and current.digest == digest:
            self._clear_failure(adapter)
            return Done()
        failed = self._failures.get(adapter)
        if failed is not None and failed.digest == digest and failed.bad:
            return Done()  # the same broken files again: wait for the next change
        floor = max(self._known_versions(adapter), current.version if current else 0)
        version = self._numbers.number(adapter, digest, floor)
        try:
            ref = local_ref(adapter, version, folder, self.base_model, files)
            return await self._apply(adapter, revision + 1, ref, folder)
        except AgentError as exc:
            return self._failed(adapter, version, digest, exc)

    async def _apply(self, adapter: str, revision: int, ref: VersionRef,
                     folder: Path) -> Outcome:
        self._pending[(adapter, ALIAS)] = ref.version
        self._on_change()
        try:
            await self._materializer.add_local(ref, folder)
            await self._swapper.apply(adapter, ALIAS, revision, ref)
        finally:
            self._pending.pop((adapter, ALIAS), None)
            self._on_change()
        self._clear_failure(adapter)
        log.info("watch dir: %s now serves local version %d", adapter, ref.version)
        return Done()

    async def _remove(self, adapter: str) -> Outcome:
        revision, current = self._routes.alias(adapter, ALIAS)
        if current is not None:
            try:
                await self._swapper.apply(adapter, ALIAS, revision + 1, None)
            except AgentError as exc:
                log.warning("watch dir: removing %s failed: %s", adapter, exc.message)
                return Retry(reason=exc.message)
            self._routes.drop_adapter(adapter)
            log.info("watch dir: %s removed", adapter)
        self._owned.discard(adapter)
        self._clear_failure(adapter)
        return Done()

    def _failed(self, adapter: str, version: int, digest: str, exc: AgentError) -> Outcome:
        # Files being written show up as a broken folder first; the write's own change
        # event brings the folder back here, so a terminal refusal waits for it.
        self._failures[adapter] = VersionFailure(
            adapter=adapter, alias=ALIAS, version=version, digest=digest, code=exc.code,
            reason=exc.message, attempts=1, bad=not exc.retryable)
        self._on_change()
        log.warning("watch dir: %s (local version %d) not served: %s: %s", adapter,
                    version, exc.code, exc.message)
        if exc.retryable:
            return Retry(reason=exc.message)
        return Failed(exc.message)

    def _clear_failure(self, adapter: str) -> None:
        if self._failures.pop(adapter, None) is not None:
            self._on_change()
