"""Uploading versions and inspecting what the registry stored, for tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import nats
from sqlalchemy import func, select

from devharness.registry import RegistryHarness
from loraplane.client.multipart import FieldPart, FilePart, MultipartBody
from loraplane.events import STREAM_NAME
from registry_service.events.models import EventRow
from registry_service.versions.models import Version

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def adapter_parts(folder: Path) -> list[tuple[str, tuple[str, bytes]]]:
    return [("files", (name, (folder / name).read_bytes()))
            for name in ADAPTER_FILES if (folder / name).exists()]


async def upload(
    harness: RegistryHarness, name: str, parts: list[tuple[str, tuple[str, bytes]]], *,
    aliases: str | None = "live", notes: str | None = None,
    headers: dict[str, str] | None = None, fields: dict[str, str] | None = None,
) -> httpx.Response:
    """A raw multipart upload; ``aliases=None`` leaves the field out (the registry then
    moves none), the default moves ``live`` as most tests want; ``fields`` adds others."""
    data: dict[str, str] = dict(fields or {})
    if aliases is not None:
        data["aliases"] = aliases
    if notes is not None:
        data["notes"] = notes
    return await harness.client.post(
        f"/v1/adapters/{name}/versions", files=parts, data=data,
        headers=headers or harness.admin_headers, timeout=120)


async def upload_dir(harness: RegistryHarness, name: str, folder: Path,
                     **kwargs: Any) -> httpx.Response:
    return await upload(harness, name, adapter_parts(folder), **kwargs)


async def upload_declared(harness: RegistryHarness, name: str, parts: list[FilePart],
                          *, aliases: str | None = None) -> httpx.Response:
    """An upload as ``loraplane push`` sends it: each file part with its Content-Digest
    (``FilePart.sha256``), the body streamed."""
    fields = [FieldPart("aliases", aliases)] if aliases is not None else []
    body = MultipartBody(fields, parts)
    return await harness.client.post(
        f"/v1/adapters/{name}/versions", content=body.__aiter__(),
        headers={**harness.admin_headers, **body.headers}, timeout=120)


def declared_parts(folder: Path) -> list[FilePart]:
    return [FilePart.of("files", folder / n, with_digest=True) for n in ADAPTER_FILES]


async def open_uploads(harness: RegistryHarness) -> list[str]:
    """Uploads begun and never finished: open S3 multipart uploads, or local ``.tmp``
    files (which ``stored_blobs`` lists too)."""
    settings = harness.settings
    if settings.blob_kind == "local":
        root = settings.blob_dir
        return sorted(str(p) for p in root.rglob(".*.tmp")) if root.exists() else []
    assert harness.s3 is not None and settings.s3_bucket is not None
    client = harness.s3.client()
    try:
        listing = client.list_multipart_uploads(Bucket=settings.s3_bucket)
    except client.exceptions.NoSuchBucket:
        # The registry makes its bucket at its first write; an upload refused before
        # one (a bad digest, seen first on a loaded machine) leaves none to list.
        return []
    return sorted(u["Key"] for u in listing.get("Uploads", []))


async def count_rows(harness: RegistryHarness) -> tuple[int, int]:
    """(versions, events) in the registry's database."""
    async with harness.ctx.db.session() as session:
        versions = await session.scalar(select(func.count()).select_from(Version))
        events = await session.scalar(select(func.count()).select_from(EventRow))
    return int(versions or 0), int(events or 0)


async def stored_blobs(harness: RegistryHarness) -> list[str]:
    """Every blob key in the store (local folder or S3 bucket)."""
    settings = harness.settings
    if settings.blob_kind == "local":
        root = settings.blob_dir
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) \
            if root.exists() else []
    assert harness.s3 is not None and settings.s3_bucket is not None
    client = harness.s3.client()
    try:
        listing = client.list_objects_v2(Bucket=settings.s3_bucket)
    except client.exceptions.NoSuchBucket:
        return []
    return sorted(obj["Key"] for obj in listing.get("Contents", []))


def staging_leftovers(harness: RegistryHarness) -> list[Path]:
    return list(harness.settings.staging_dir.rglob("*"))


async def stream_events(nats_url: str) -> list[dict[str, Any]]:
    """Every event in the registry's JetStream stream, oldest first."""
    # One attempt, no reconnects: a caller that polls asks again, a dead server fails fast.
    client = await nats.connect(nats_url, connect_timeout=2, allow_reconnect=False,
                                max_reconnect_attempts=0)
    try:
        js = client.jetstream()
        info = await js.stream_info(STREAM_NAME)
        if info.state.messages == 0:
            return []  # first_seq is 0 then, and asking for message 0 is a bad request
        events = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            raw = await js.get_msg(STREAM_NAME, seq)
            assert raw.data is not None
            events.append(json.loads(raw.data))
        return events
    finally:
        await client.close()
