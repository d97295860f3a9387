"""Presigned blob URLs added to events as the relay publishes them.

Without them every agent asks the registry for every file of a pushed version and is
sent on to the blob store with a 307: with N agents, a push costs the registry N x
files requests, all answered while the fleet waits. With them the agent GETs the
store directly; the registry path in ``FileRef.url`` stays the fallback for an event
replayed after its URLs expired, an agent of a store it cannot reach, or a relay that
could not sign.

The URLs are added to the published message only: the outbox row (and so
``GET /v1/events`` and the UI) never holds one, and a URL is valid for
``presign_expires_s`` from the publish, not from the write.

The same linker adds them to the desired-state snapshot (``GET /v1/desired``) as it is
answered, so that a starting agent, which reads the snapshot and then fetches what it
must have on disk, skips the 307 too. That response is read with a token that may read
every adapter it lists, which is what the redirect itself checks; it is signed with
each read, so its URLs are valid for ``presign_expires_s`` from the read.

A file of at most ``INLINE_MAX_BYTES`` goes in the published event itself as well
(``content``, base64): every adapter has one, its ``adapter_config.json`` of under a
kilobyte, and at a push every agent of the fleet fetched it, a hundred GETs on the
store for a hundred agents and one more round trip on each agent's way to serving. The
relay reads it from the store once (a small content-addressed cache keeps it for the
next event naming it); the agent checks its size and sha256 as it would a download's
and fetches the file instead if they do not match. Like the URLs, it is in the message
only, never in the outbox row.

Security: a presigned URL is a read credential for one blob until it expires. The
redirect hands one only to a live token that may read the adapter; an event hands one
to whoever may read the stream. Agent tokens are global readers, so for agents the two
are the same *if* the stream is as closed as the registry's API, which is why ``auto``
adds URLs only when the registry itself must authenticate to NATS (an external server
with credentials) and never with the embedded, credential-less server. Revoking an
agent then means revoking its NATS credentials too, as it already does for the event
metadata it reads there. An inlined file is handed out on the same terms: the linker
that adds URLs adds the small files, and only where it is on.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import logging
import time
from collections import OrderedDict
from typing import Any

from loraplane.nats_auth import NatsSecurity
from registry_service.blobs.base import BlobStore
from registry_service.errors import BlobNotFound, RegistryError
from registry_service.settings import RegistrySettings

log = logging.getLogger(__name__)

INLINE_MAX_BYTES = 4096
# Small files kept by sha256 (content-addressed, so never stale): at most a MiB.
INLINE_CACHE_ENTRIES = 256
# The relay publishes while it reads: a store that is down or slow must not hold the
# events back. A read gets this long, and after one fails none is tried for a while
# (the events go out with URLs only).
INLINE_READ_TIMEOUT_S = 1.0
INLINE_PAUSE_S = 30.0


def event_file_linker(settings: RegistrySettings, blobs: BlobStore,
                      security: NatsSecurity | None) -> FileLinker | None:
    """The relay's linker, or None: ``on``, or ``auto`` when the registry authenticates
    to NATS (``security`` None: the embedded server, which takes no credentials)."""
    mode = settings.event_file_urls
    authenticated = security is not None and bool(security.auth_kinds)
    if mode == "off" or (mode == "auto" and not authenticated):
        return None
    return FileLinker(blobs, settings.presign_expires_s)


def _file_lists(payload: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Every ``files`` list of an event payload (the event's own and its target's)."""
    found: list[list[dict[str, Any]]] = []
    if isinstance(payload.get("files"), list):
        found.append(payload["files"])
    target = payload.get("target")
    if isinstance(target, dict) and isinstance(target.get("files"), list):
        found.append(target["files"])
    return found


def _snapshot_file_lists(snapshot: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Every ``files`` list of a dumped ``DesiredState``: each alias target's."""
    return [alias["target"]["files"] for adapter in snapshot.get("adapters", [])
            for alias in adapter.get("aliases", [])]


Signed = dict[tuple[str, str], str | None]


class FileLinker:
    """Signs one GET URL per blob of an event's files, valid for ``expires_s``."""

    def __init__(self, blobs: BlobStore, expires_s: int) -> None:
        self._blobs = blobs
        self.expires_s = expires_s
        self._failing = False
        self._small: OrderedDict[str, bytes] = OrderedDict()
        self._reads_paused_until = 0.0

    async def _sign(self, lists: list[list[dict[str, Any]]], what: str) -> Signed | None:
        """(sha256, name) -> URL for every file in ``lists``; None if signing fails."""
        signed: Signed = {}
        try:
            for files in lists:
                for entry in files:
                    key = (str(entry["sha256"]), str(entry["name"]))
                    if key not in signed:
                        signed[key] = await self._blobs.presigned_url(
                            key[0], filename=key[1], expires_s=self.expires_s)
        except (RegistryError, ValueError, KeyError) as exc:
            # It still goes out: agents fall back to the registry path.
            if not self._failing:
                log.warning("%s go out without file URLs: %s", what, type(exc).__name__)
            self._failing = True
            return None
        self._failing = False
        return signed

    async def link_snapshot(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        """``snapshot`` (a ``DesiredState`` dumped for this response alone) with
        ``direct_url`` on each file, changed in place; unchanged if signing fails."""
        await self._add_urls(_snapshot_file_lists(snapshot), "snapshots")
        return snapshot

    async def link(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``payload`` with ``direct_url`` on each file (none if signing
        fails) and ``content`` on each small one (none the store cannot give at once).
        A copy: the payload shares its lists with the outbox row's JSON."""
        linked = copy.deepcopy(payload)
        lists = _file_lists(linked)
        await self._add_urls(lists, "events")
        await self._add_contents(lists)
        return linked

    async def _add_contents(self, lists: list[list[dict[str, Any]]]) -> None:
        """Set ``content`` (base64) on every file of at most ``INLINE_MAX_BYTES``, in
        place; a file the store cannot give (or gives wrong) goes without."""
        for files in lists:
            for entry in files:
                size, sha256 = entry.get("size"), entry.get("sha256")
                if not (isinstance(size, int) and isinstance(sha256, str)
                        and 0 <= size <= INLINE_MAX_BYTES):
                    continue
                data = await self._small_blob(sha256, size)
                if data is not None:
                    entry["content"] = base64.b64encode(data).decode("ascii")

    async def _small_blob(self, sha256: str, size: int) -> bytes | None:
        data = self._small.get(sha256)
        if data is not None:
            self._small.move_to_end(sha256)
            return data
        if time.monotonic() < self._reads_paused_until:
            return None
        try:
            async with asyncio.timeout(INLINE_READ_TIMEOUT_S):
                data = await self._read(sha256)
        except BlobNotFound:
            log.warning("blob %s is not in the store", sha256[:12])
            return None
        except (RegistryError, TimeoutError) as exc:  # the store is down or slow
            self._reads_paused_until = time.monotonic() + INLINE_PAUSE_S
            log.warning("small files go out by URL only for %.0f s: reading blob %s: %s",
                        INLINE_PAUSE_S, sha256[:12], type(exc).__name__)
            return None
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
            log.warning("blob %s in the store does not match its digest", sha256[:12])
            return None
        self._small[sha256] = data
        if len(self._small) > INLINE_CACHE_ENTRIES:
            self._small.popitem(last=False)
        return data

    async def _read(self, sha256: str) -> bytes:
        async with await self._blobs.open_stream(sha256) as stream:
            return b"".join([chunk async for chunk in stream])

    async def _add_urls(self, lists: list[list[dict[str, Any]]], what: str) -> None:
        """Sign every file of ``lists`` and set its URL, in place; nothing if it fails."""
        signed = await self._sign(lists, what) if lists else None
        if signed is not None:
            for files in lists:
                files[:] = _with_urls(files, signed)


def _with_urls(files: list[dict[str, Any]], signed: Signed) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for entry in files:
        url = signed.get((str(entry["sha256"]), str(entry["name"])))
        out.append({**entry, "direct_url": url} if url else entry)
    return out
