"""The collector's pass, page by page, against real stores and databases: it asks the
database about each page of the store's listing and never reads the versions."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from registry_service.blobs import LocalBlobStore, S3BlobStore, gc, leases, local
from registry_service.blobs.base import BlobStore, StoredBlob
from registry_service.blobs.gc import collect_garbage
from registry_service.blobs.models import version_blobs
from registry_service.db.engine import Database
from registry_service.metrics import RegistryMetrics
from registry_service.settings import RegistrySettings
from registry_service.versions.models import Version
from tests.registry.seed import seed_adapter

DAY_S = 86400.0
_names = itertools.count()


def source(folder: Path, data: bytes) -> tuple[str, Path]:
    sha = hashlib.sha256(data).hexdigest()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / sha
    path.write_bytes(data)
    return sha, path


async def put(store: BlobStore, folder: Path, data: bytes) -> str:
    sha, path = source(folder, data)
    await store.put_file(sha, path, len(data))
    return sha


async def put_many(store: BlobStore, folder: Path, kind: str, count: int) -> list[str]:
    return [await put(store, folder, f"{kind}-{i}-{os.urandom(8).hex()}".encode())
            for i in range(count)]


def backdate(store: LocalBlobStore, shas: list[str]) -> None:
    old = time.time() - 2 * DAY_S
    for sha in shas:
        os.utime(store.path_for(sha), (old, old))


async def name_in_versions(db: Database, per_version: list[list[str]]) -> None:
    """Versions of a new adapter, each naming its digests, as an upload writes them."""
    async with db.session() as session:
        adapter = (await seed_adapter(session, tenant="acme", name=f"a{next(_names)}",
                                      base_model="tiny-llama")).adapter
        for number, digests in enumerate(per_version, 1):
            files = [{"name": f"f{i}", "size": 1, "sha256": sha}
                     for i, sha in enumerate(digests)]
            version = Version(adapter_id=adapter.id, number=number, digest=f"{number:064x}",
                              files=files, total_size=len(files), rank=8, alpha=16.0,
                              target_modules=["q_proj"], uploader="tests")
            session.add(version)
            await session.flush()
            session.add_all(version_blobs(version.id, digests))
        adapter.last_version = len(per_version)
        await session.commit()


async def lease(db: Database, shas: list[str]) -> None:
    async with db.session() as session:
        assert await leases.hold(session, shas, 600.0) == []
        await session.commit()


async def listed(store: BlobStore) -> set[str]:
    return {blob.sha256 async for blob in store.list_blobs()}


def settings(tmp_path: Path, grace_s: float) -> RegistrySettings:
    return RegistrySettings(data_dir=tmp_path / "data", blob_gc_grace_s=grace_s)


def sample(metrics: RegistryMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    assert value is not None, name
    return value


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> int:
    """Pages of four blobs, the local listing read 100 bytes at a time (a line and a
    part): every test spans several pages and reads."""
    monkeypatch.setattr(gc, "PAGE_BLOBS", 4)
    monkeypatch.setattr(local, "LIST_READ_BYTES", 100)
    return 4


async def test_a_pass_over_many_pages_deletes_exactly_the_old_unreferenced(
    db: Database, local_store: LocalBlobStore, tmp_path: Path, small_pages: int,
) -> None:
    store, folder = local_store, tmp_path / "src"
    named = await put_many(store, folder, "named", 7)
    orphans = await put_many(store, folder, "orphan", 6)
    young = await put_many(store, folder, "young", 2)
    held = await put_many(store, folder, "held", 2)
    backdate(store, named + orphans + held)
    # Shared blobs are named by several versions; one version names none.
    await name_in_versions(db, [named[:3], named[2:5], named[4:], named[:1], []])
    await lease(db, held)
    metrics = RegistryMetrics()

    report = await collect_garbage(db, store, settings(tmp_path, 3600.0), metrics)

    assert report.model_dump() == {"examined": 17, "referenced": 7, "too_young": 2,
                                   "leased": 2, "deleted": 6, "incomplete": 0}
    assert await listed(store) == set(named + young + held)
    assert sample(metrics, "loraplane_registry_blob_gc_blobs_examined_total") == 17
    assert sample(metrics, "loraplane_registry_blob_gc_deleted_total") == 6
    assert sample(metrics, "loraplane_registry_blob_gc_running") == 0
    assert sample(metrics, "loraplane_registry_blob_gc_pass_seconds_count") == 1
    again = await collect_garbage(db, store, settings(tmp_path, 3600.0), metrics)
    assert again.deleted == 0 and again.examined == 11


async def test_a_pass_over_s3_pages(
    db: Database, s3_store: S3BlobStore, tmp_path: Path, small_pages: int,
) -> None:
    store, folder = s3_store, tmp_path / "src"
    named = await put_many(store, folder, "named", 5)
    orphans = await put_many(store, folder, "orphan", 7)
    held = await put_many(store, folder, "held", 1)
    await name_in_versions(db, [named[:2], named[1:]])
    await lease(db, held)

    report = await collect_garbage(db, store, settings(tmp_path, 0.0))

    assert (report.examined, report.referenced, report.leased, report.deleted) == (13, 5, 1, 7)
    assert await listed(store) == set(named + held)
    assert orphans


class PausedStore:
    """A store whose listing stops before its ``at``-th blob until released."""

    def __init__(self, store: BlobStore, at: int) -> None:
        self._store, self._at = store, at
        self.paused, self.release = asyncio.Event(), asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def list_blobs(self) -> AsyncIterator[StoredBlob]:
        index = 0
        async for blob in self._store.list_blobs():
            if index == self._at:
                self.paused.set()
                await self.release.wait()
            index += 1
            yield blob


async def test_metrics_show_a_pass_in_progress_page_by_page(
    db: Database, local_store: LocalBlobStore, tmp_path: Path, small_pages: int,
) -> None:
    await put_many(local_store, tmp_path / "src", "young", 10)
    paused = PausedStore(local_store, at=2 * small_pages)
    metrics = RegistryMetrics()
    run = asyncio.create_task(collect_garbage(
        db, paused, settings(tmp_path, 3600.0), metrics))
    await asyncio.wait_for(paused.paused.wait(), 30)

    # Two pages asked about, the third being listed: the scrape shows how far it got.
    assert sample(metrics, "loraplane_registry_blob_gc_running") == 1
    assert sample(metrics, "loraplane_registry_blob_gc_blobs_examined_total") == 8
    paused.release.set()
    assert (await run).examined == 10
    assert sample(metrics, "loraplane_registry_blob_gc_blobs_examined_total") == 10
    assert sample(metrics, "loraplane_registry_blob_gc_running") == 0


@contextmanager
def statements(db: Database) -> Iterator[list[str]]:
    seen: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(db.engine.sync_engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", note)


async def test_a_pass_never_reads_the_versions(
    db: Database, local_store: LocalBlobStore, tmp_path: Path, small_pages: int,
) -> None:
    """The statements of a pass name no ``versions`` table, and as many versions again
    (naming stored blobs and others) add none: one probe per page."""
    folder = tmp_path / "src"
    named = await put_many(local_store, folder, "named", 6)
    await put_many(local_store, folder, "young", 3)  # unreferenced, kept: too young
    backdate(local_store, named)
    await name_in_versions(db, [[sha] for sha in named])
    with statements(db) as few:
        report = await collect_garbage(db, local_store, settings(tmp_path, 3600.0))
    assert (report.referenced, report.too_young) == (6, 3)

    others = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(60)]
    await name_in_versions(db, [[named[i % 6], others[i]] for i in range(60)])
    with statements(db) as many:
        again = await collect_garbage(db, local_store, settings(tmp_path, 3600.0))
    assert again == report
    assert len(many) == len(few)
    assert not [s for s in many if re.search(r"\bversions\b", s, re.IGNORECASE)], many


async def test_the_local_store_lists_blobs_only_and_sweeps_old_temporary_files(
    local_store: LocalBlobStore, tmp_path: Path, small_pages: int,
) -> None:
    shas = await put_many(local_store, tmp_path / "src", "blob", 7)  # three batches
    shard = local_store.path_for(shas[0]).parent
    stale = [shard / f".{shas[0]}.left.tmp", local_store.root / ".upload.left.tmp"]
    fresh = shard / f".{shas[1]}.writing.tmp"
    for path in [*stale, fresh, shard / "not-a-digest"]:
        path.write_bytes(b"x")
    old = time.time() - DAY_S
    for path in stale:
        os.utime(path, (old, old))

    found = [blob.sha256 async for blob in local_store.list_blobs()]
    assert sorted(found) == sorted(shas)
    assert await local_store.sweep_incomplete(3600.0) == 2
    assert not any(path.exists() for path in stale) and fresh.exists()
    assert await listed(local_store) == set(shas)


def test_the_rest_makes_the_work_its_share_of_the_time() -> None:
    assert gc.rest_after(1.0, 0.25) == pytest.approx(3.0)  # busy 1 s of every 4
    assert gc.rest_after(0.2, 0.5) == pytest.approx(0.2)
    assert gc.rest_after(0.2, 1.0) == 0.0
    assert gc.rest_after(-0.1, 0.5) == 0.0  # a clock step back never means a longer rest


async def test_a_pass_rests_after_each_page_by_its_busy_share(
    db: Database, local_store: LocalBlobStore, tmp_path: Path, small_pages: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await put_many(local_store, tmp_path / "src", "blob", 9)
    rests: list[tuple[float, float]] = []

    def recorded(busy_s: float, busy_share: float) -> float:
        rests.append((busy_s, busy_share))
        return 0.0

    monkeypatch.setattr(gc, "rest_after", recorded)
    config = settings(tmp_path, 3600.0).model_copy(update={"blob_gc_busy_share": 0.4})

    report = await collect_garbage(db, local_store, config)

    assert report.examined == 9
    assert len(rests) == 3  # pages of 4, 4 and 1
    assert all(busy >= 0 and share == 0.4 for busy, share in rests)
