"""Garbage collection of blobs no version references, against real stores and databases.

An upload stores its blobs before it commits; a commit that fails afterwards (here: the
adapter is deleted while the upload streams) leaves blobs nothing references.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import create_async_engine

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness, blocked_on_a_lock
from devharness.uploads import adapter_parts, stored_blobs
from devharness.waiting import eventually
from registry_service.blobs.models import BlobLease


def multipart(folder: Path) -> tuple[bytes, str]:
    """The body and content type of an upload of ``folder``, as the client sends it."""
    request = httpx.Request("POST", "http://registry/", files=adapter_parts(folder))
    return request.read(), request.headers["content-type"]


class HeldBody:
    """A request body sent up to its last bytes, then held until ``release()``."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.sent = asyncio.Event()
        self._release = asyncio.Event()

    def release(self) -> None:
        self._release.set()

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self.body[:-64]
        self.sent.set()
        await self._release.wait()
        yield self.body[-64:]


def held_upload(registry: RegistryHarness, name: str,
                folder: Path) -> tuple[HeldBody, asyncio.Task[httpx.Response]]:
    body, content_type = multipart(folder)
    held = HeldBody(body)
    task = asyncio.create_task(registry.client.post(
        f"/v1/adapters/{name}/versions", content=held.chunks(),
        headers={**registry.admin_headers, "Content-Type": content_type}, timeout=120))
    return held, task


async def collect(registry: RegistryHarness) -> dict[str, int]:
    response = await registry.client.post("/v1/admin/blob-gc", headers=registry.admin_headers)
    assert response.status_code == 200, response.text
    report: dict[str, int] = response.json()
    return report


async def reaches_staging(registry: RegistryHarness) -> bool:
    staging = registry.settings.staging_dir
    return staging.is_dir() and any(p.is_dir() and any(p.iterdir()) for p in staging.iterdir())


async def orphan_of_a_refused_upload(registry: RegistryHarness, folder: Path) -> list[str]:
    """The issue's repro: the adapter is deleted while its upload streams. Returns the
    blob keys the refused upload left."""
    await registry.create_adapter("doomed")
    before = await stored_blobs(registry)
    held, task = held_upload(registry, "doomed", folder)
    await eventually(held.sent.is_set, what="the body sent up to its end")
    await eventually(lambda: reaches_staging(registry), what="the upload in staging")
    deleted = await registry.client.delete("/v1/adapters/doomed",
                                           headers=registry.admin_headers)
    assert deleted.status_code == 204, deleted.text
    held.release()
    response = await task
    assert response.status_code == 404, response.text
    return sorted(set(await stored_blobs(registry)) - set(before))


async def test_blobs_of_an_upload_refused_at_commit_are_collected(
    gc_registry: RegistryHarness, tmp_path: Path,
) -> None:
    registry = gc_registry
    await registry.create_adapter("kept")
    kept = await registry.client.post(
        "/v1/adapters/kept/versions", files=adapter_parts(make_adapter(tmp_path / "k", seed=2)),
        headers=registry.admin_headers)
    assert kept.status_code == 201, kept.text
    assert await leased(registry) == set()  # the commit gave its leases back
    referenced = await stored_blobs(registry)

    orphans = await orphan_of_a_refused_upload(registry, make_adapter(tmp_path / "d", seed=1))
    assert orphans  # what the issue found: blobs nothing references
    assert await leased(registry) == set()  # so did the refused upload

    report = await collect(registry)
    assert report["deleted"] == len(orphans)
    assert await stored_blobs(registry) == referenced
    # The version that references its blobs still downloads every file.
    for entry in kept.json()["files"]:
        download = await registry.client.get(
            f"/v1/adapters/kept/versions/1/files/{entry['name']}",
            headers=registry.admin_headers, follow_redirects=False)
        assert download.status_code in (200, 307), download.text
    assert (await collect(registry))["deleted"] == 0


async def test_a_tenant_admin_may_not_collect(gc_registry: RegistryHarness) -> None:
    headers = await gc_registry.token("admin", tenant="acme")
    response = await gc_registry.client.post("/v1/admin/blob-gc", headers=headers)
    assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "forbidden"


async def test_collector_keeps_a_blob_an_upload_in_flight_will_reference(
    pg_registry: RegistryHarness, tmp_path: Path,
) -> None:
    """The upload has leased and stored its blobs (which were orphans already in the
    store, so storing them wrote nothing) and waits for the adapter's row lock to commit:
    the collector runs right then and must leave them."""
    registry = pg_registry
    registry.settings.blob_gc_grace_s = 0.0
    folder = make_adapter(tmp_path / "a", seed=3)
    orphans = await orphan_of_a_refused_upload(registry, folder)
    await registry.create_adapter("bot")

    url = registry.settings.effective_database_url
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn, conn.begin():
            await conn.execute(text("SELECT id FROM adapters WHERE name = 'bot' FOR UPDATE"))
            held, task = held_upload(registry, "bot", folder)
            held.release()
            await eventually(lambda: blocked_on_a_lock(url), what="the upload at its commit")
            assert await leased(registry) == {key.rsplit("/", 1)[-1] for key in orphans}
            report = await collect(registry)
            assert report["deleted"] == 0 and report["leased"] == len(orphans)
        response = await task
    finally:
        await engine.dispose()
    assert response.status_code == 201, response.text
    assert await leased(registry) == set()
    assert sorted(set(await stored_blobs(registry)) & set(orphans)) == orphans
    for entry in response.json()["files"]:
        download = await registry.client.get(
            f"/v1/adapters/bot/versions/1/files/{entry['name']}",
            headers=registry.admin_headers, follow_redirects=False)
        assert download.status_code == 307, download.text
    assert (await collect(registry))["deleted"] == 0


async def leased(registry: RegistryHarness) -> set[str]:
    async with registry.ctx.db.session() as session:
        rows = await session.scalars(select(BlobLease.sha256).where(BlobLease.holders > 0))
        return set(rows)
