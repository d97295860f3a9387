"""Uploading versions and inspecting what the registry stored, for tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import nats
from sqlalchemy import func, select

from devharness.registry import RegistryHarness
from loraplane.events import STREAM_NAME
from registry_service.events.models import EventRow
from registry_service.versions.models import Version

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def adapter_parts(folder: Path) -> list[tuple[str, tuple[str, bytes]]]:
    return [("files", (name, (folder / name).read_bytes()))
            for name in ADAPTER_FILES if (folder / name).exists()]


async def upload(
    harness: RegistryHarness, name: str, parts: list[tuple[str, tuple[str, bytes]]], *,
    aliases: str | None = None, notes: str | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    data: dict[str, str] = {}
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
