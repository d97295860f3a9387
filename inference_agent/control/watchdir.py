"""``--watch-dir DIR``: a desired-state source of adapters in a local folder, for
development and air-gapped hosts.

Every ``DIR/<adapter>/`` holding ``adapter_config.json`` and
``adapter_model.safetensors`` is desired as ``<adapter>`` (alias ``live``). This module
only says what a folder holds now: a change seen by watchfiles queues the key
``local/<adapter>`` on the agent's one work queue, and the reconciler acts on it as on
a registry version (copied and validated into the disk cache, loaded under
``adapter@N``, flipped, the old version drained), with the same failure tracking,
retries and status. A folder that fails leaves the previous version serving and is
reported with the reason; a removed folder removes the alias. On a name clash with the
registry, the local folder wins: the reconciler leaves alone what ``owns`` claims.

Version numbers are monotonic per adapter and persisted under the cache dir with the
digest they were given to, so a restart never puts other weights under a used name.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import watchfiles

from inference_agent.control.keys import local_key
from inference_agent.errors import AdapterRejected
from loraplane.digest import sha256_file, version_digest
from loraplane.events import FileRef, VersionRef
from loraplane.lora import ALLOWED_FILES, CONFIG_FILE, AdapterInvalid, parse_lora_config
from loraplane.naming import DEFAULT_ALIAS, is_slug
from loraplane.private_files import write_private

log = logging.getLogger(__name__)

STATE_FILE = "local-versions.json"
# The one alias a local folder is served under.
LOCAL_ALIAS = DEFAULT_ALIAS


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
        write_private(tmp, json.dumps(self._numbers, indent=1, sort_keys=True).encode())
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


@dataclass(frozen=True)
class LocalVersion:
    """What a folder holds now: its files, their digest, and the number they go by."""

    adapter: str
    folder: Path
    version: int
    digest: str
    files: list[tuple[str, int, str]]

    def ref(self, base_model: str) -> VersionRef:
        """Its VersionRef; AdapterRejected if the folder is not a usable adapter."""
        return local_ref(self.adapter, self.version, self.folder, base_model, self.files)


DEFAULT_WATCH_TENANT = "local"


class WatchDirSource:
    """The adapters of one folder, as keys on the agent's work queue."""

    def __init__(self, watch_dir: Path, *, enqueue: Callable[[str], None],
                 copier: LocalCopier, state_dir: Path,
                 known_versions: Callable[[str], int] | None = None,
                 debounce_ms: int = 1000, tenant: str = DEFAULT_WATCH_TENANT) -> None:
        self.watch_dir = watch_dir.resolve()
        # Every watched adapter belongs to this tenant (--watch-tenant).
        self.tenant = tenant
        self._enqueue = enqueue
        self._copier = copier
        self._numbers = LocalVersions(state_dir / STATE_FILE)
        self._known_versions = known_versions or (lambda _adapter: 0)
        self.debounce_ms = debounce_ms
        self._owned: set[str] = set()

    # --- ownership (a name clash: the local folder wins) ------------------------------

    def owns(self, adapter: str) -> bool:
        return adapter in self._owned

    def release(self, adapter: str) -> None:
        """The folder is gone and its alias removed: the registry may serve the name."""
        self._owned.discard(adapter)

    # --- intake -------------------------------------------------------------------------

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
        # Owned from the start, so the registry's reconcile never touches a local adapter.
        self._owned |= found
        for name in sorted(found):
            self._enqueue(local_key(name))
        return found

    async def run(self) -> None:
        """Queue the folders that change, until cancelled (call ``scan`` first)."""
        async for changes in watchfiles.awatch(self.watch_dir, debounce=self.debounce_ms,
                                               recursive=True):
            for _change, raw in changes:
                adapter = self._adapter_of(Path(raw))
                if adapter is not None:
                    self._enqueue(local_key(adapter))

    def _adapter_of(self, path: Path) -> str | None:
        try:
            parts = path.resolve().relative_to(self.watch_dir).parts
        except ValueError:
            return None
        if not parts or parts[0].startswith(".") or not is_slug(parts[0]):
            return None
        return parts[0]

    # --- reading a folder -----------------------------------------------------------------

    async def read(self, adapter: str, current: VersionRef | None) -> LocalVersion | None:
        """What ``adapter``'s folder holds now; None if there is no folder.

        ``current`` is the version served now: the same files keep its number, other
        files get the next number above it and above any version this host knows.
        """
        folder = self.watch_dir / adapter
        if not folder.is_dir():
            return None
        self._owned.add(adapter)
        files = await asyncio.to_thread(hash_folder, folder)
        digest = version_digest(files)
        if current is not None and current.digest == digest:
            version = current.version
        else:
            floor = max(self._known_versions(adapter), current.version if current else 0)
            version = self._numbers.number(adapter, digest, floor)
        return LocalVersion(adapter, folder, version, digest, files)

    async def copy_in(self, ref: VersionRef, local: LocalVersion) -> None:
        """Copy and validate the folder into the disk cache (the swap then finds it)."""
        await self._copier.add_local(ref, local.folder)
