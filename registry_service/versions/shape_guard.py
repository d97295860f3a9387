"""Refuse a new version whose tensors face another base model than the adapter's current
versions (those its aliases point at, and the latest), even when the registry was given
no base model config: a hidden size of 64 after versions of 128 is another model."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.lora.errors import AdapterInvalid
from loraplane.lora.files import WEIGHTS_FILE
from loraplane.lora.safetensors import parse_header_bytes
from loraplane.lora.shape_change import Features, ShapeChange, find_shape_change
from loraplane.lora.tensors import header_features
from registry_service.adapters.models import Adapter
from registry_service.aliases.models import Alias
from registry_service.blobs.base import BlobStore
from registry_service.errors import BlobNotFound
from registry_service.versions.models import Version

log = logging.getLogger(__name__)
# Read from the blob store this many bytes at a time until the header is in.
_READ_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class StoredWeights:
    """A version's weights file, read once the transaction that found it has ended."""

    version: int
    sha256: str
    size: int


async def current_versions(session: AsyncSession, adapter: Adapter,
                           digest: str) -> list[StoredWeights]:
    """The versions a new one is compared with: the latest and every alias's, newest
    first; none when ``digest`` is already a version (a re-upload adds nothing)."""
    known = await session.scalar(select(Version.id).where(
        Version.adapter_id == adapter.id, Version.digest == digest))
    if known is not None:
        return []
    aliased = select(Alias.version_id).where(Alias.adapter_id == adapter.id,
                                             Alias.version_id.is_not(None))
    query = select(Version).where(
        Version.adapter_id == adapter.id,
        or_(Version.id.in_(aliased), Version.number == adapter.last_version),
    ).order_by(Version.number.desc())
    found = []
    for version in await session.scalars(query):
        for entry in version.files:
            if entry["name"] == WEIGHTS_FILE:
                found.append(StoredWeights(version.number, str(entry["sha256"]),
                                           int(entry["size"])))
    return found


async def find_change(blobs: BlobStore, versions: list[StoredWeights], features: Features,
                      *, max_header_bytes: int) -> ShapeChange | None:
    """The first shape change of ``features`` against one of ``versions``, else None."""
    for version in versions:
        old = await stored_features(blobs, version, max_header_bytes)
        change = find_shape_change(features, old, version=version.version)
        if change is not None:
            return change
    return None


async def stored_features(blobs: BlobStore, weights: StoredWeights,
                          max_header_bytes: int) -> Features:
    """The (in, out) features of a stored version, from its weights file's header only.

    A blob gone or a header unreadable is the registry's problem, not the new upload's
    (it was checked when stored): compared with the other versions, and logged."""
    try:
        raw = await _header_bytes(blobs, weights.sha256, max_header_bytes)
        return header_features(parse_header_bytes(raw, weights.size - 8 - len(raw)))
    except (AdapterInvalid, BlobNotFound) as exc:
        log.error("version %d's stored weights cannot be read: %s", weights.version, exc)
        return {}


async def _header_bytes(blobs: BlobStore, sha256: str, max_header_bytes: int) -> bytes:
    """The JSON header of a stored safetensors blob: the first 8 + length bytes."""
    got = bytearray()
    async with await blobs.open_stream(sha256, chunk_size=_READ_BYTES) as stream:
        async for chunk in stream:
            got += chunk
            if len(got) < 8:
                continue
            length = min(int.from_bytes(got[:8], "little"), max_header_bytes)
            if len(got) >= 8 + length:
                return bytes(got[8:8 + length])
    return bytes(got[8:])
