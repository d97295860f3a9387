"""Garbage collection of blobs no version references.

A blob is stored before the transaction that references it commits, so a commit that
fails (the adapter was deleted meanwhile, the database went away) or a registry killed
between the two leaves a blob nothing names. The collector removes such a blob when
all of these hold:

- no version names it: no ``version_blobs`` row (written in the commit that creates the
  version), checked again inside the transaction that claims it;
- no upload holds a lease on it: an upload leases its blobs (``blob_leases``) before it
  stores them and commits only while the lease holds, so a blob an upload in flight is
  about to reference is never taken, even one that was already in the store;
- the store wrote it more than ``blob_gc_grace_s`` ago (a writer that took no lease,
  such as an older registry during a rolling upgrade, has that long to commit).

A pass streams the store's listing in pages of ``PAGE_BLOBS`` and asks the database,
one short transaction per page, which of a page's digests no version names
(``named.py``): it never reads the versions, so its memory and each step's time on the
event loop stay the same whatever the number of versions and blobs. After each page it
rests, so that it is busy at most ``blob_gc_busy_share`` of its time: a collector has
hours, requests have milliseconds.

It also removes what uploads that never finished left in the store (a registry killed
mid-upload): open S3 multipart uploads and temporary objects under ``uploads/``, or the
local store's ``.tmp`` files, begun more than ``blob_upload_lease_s`` ago.

While it deletes a blob the collector marks the lease row (``collecting_until``); an
upload of the same bytes waits for the deletion to end and then stores the blob again.
It runs at start-up, every ``blob_gc_interval_s``, and on ``POST /v1/admin/blob-gc``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import BaseModel

from registry_service.auth.roles import Principal
from registry_service.background import BackgroundTask
from registry_service.blobs.base import BlobStore, StoredBlob
from registry_service.blobs.leases import claim_for_collection, drop_expired, release_collection
from registry_service.blobs.named import is_named, unnamed
from registry_service.db.base import utcnow
from registry_service.db.engine import Database
from registry_service.errors import Forbidden, RegistryError
from registry_service.metrics import RegistryMetrics
from registry_service.settings import RegistrySettings

log = logging.getLogger(__name__)

# How long a collector's mark on a blob lasts; a delete is only sent while at least
# DELETE_MARGIN_S of it is left (an S3 call gives up long before that).
CLAIM_S = 120.0
DELETE_MARGIN_S = 60.0
# Stored blobs asked about in one statement (and held at once).
PAGE_BLOBS = 1000


class GcReport(BaseModel):
    examined: int = 0
    referenced: int = 0
    too_young: int = 0
    leased: int = 0
    deleted: int = 0
    # Uploads that never finished (open multipart uploads, temporary objects or files).
    incomplete: int = 0


async def pages(blobs: BlobStore, size: int) -> AsyncIterator[list[StoredBlob]]:
    """The store's listing, ``size`` blobs at a time."""
    page: list[StoredBlob] = []
    async for blob in blobs.list_blobs():
        page.append(blob)
        if len(page) >= size:
            yield page
            page = []
    if page:
        yield page


@dataclass
class _Pass:
    db: Database
    blobs: BlobStore
    report: GcReport
    cutoff: datetime
    metrics: RegistryMetrics | None

    async def page(self, page: list[StoredBlob]) -> None:
        self.report.examined += len(page)
        if self.metrics is not None:
            self.metrics.blob_gc_examined.inc(len(page))
        async with self.db.session() as session:
            candidates = await unnamed(session, [blob.sha256 for blob in page])
        self.report.referenced += len(page) - len(candidates)
        for blob in page:
            if blob.sha256 not in candidates:
                continue
            if blob.modified > self.cutoff:
                self.report.too_young += 1
            else:
                await self.collect(blob)

    async def collect(self, blob: StoredBlob) -> None:
        until = utcnow() + timedelta(seconds=CLAIM_S)
        deadline = time.monotonic() + CLAIM_S - DELETE_MARGIN_S
        async with self.db.session() as session:
            if not await claim_for_collection(session, blob.sha256, until):
                self.report.leased += 1
                return
            if await is_named(session, blob.sha256):
                self.report.referenced += 1
                return  # the session rolls the claim back
            await session.commit()
        try:
            if time.monotonic() < deadline:
                await self.blobs.delete(blob.sha256)
                self.report.deleted += 1
                if self.metrics is not None:
                    self.metrics.blob_gc_deleted.inc()
                log.info("collected unreferenced blob %s", blob.sha256)
        finally:
            async with self.db.session() as session:
                await release_collection(session, blob.sha256, until)
                await session.commit()


def rest_after(busy_s: float, busy_share: float) -> float:
    """How long to rest after ``busy_s`` of work so that the work is ``busy_share`` of
    the time (0 at a share of 1: requests still go first between pages)."""
    return max(busy_s, 0.0) * (1.0 - busy_share) / busy_share


async def collect_garbage(db: Database, blobs: BlobStore, settings: RegistrySettings,
                          metrics: RegistryMetrics | None = None) -> GcReport:
    """One pass over the store; see the module docstring for what is removed.
    ``metrics`` (when given) shows the pass running, its progress and its time."""
    if metrics is None:
        return await _collect(db, blobs, settings, None)
    with metrics.blob_gc_running.track_inprogress(), metrics.blob_gc_pass.time():
        return await _collect(db, blobs, settings, metrics)


async def _collect(db: Database, blobs: BlobStore, settings: RegistrySettings,
                   metrics: RegistryMetrics | None) -> GcReport:
    report = GcReport()
    cutoff = utcnow() - timedelta(seconds=settings.blob_gc_grace_s)
    gc = _Pass(db, blobs, report, cutoff, metrics)
    busy_since = time.monotonic()
    async for page in pages(blobs, PAGE_BLOBS):
        await gc.page(page)
        await asyncio.sleep(rest_after(time.monotonic() - busy_since,
                                       settings.blob_gc_busy_share))
        busy_since = time.monotonic()
    async with db.session() as session:
        await drop_expired(session)
        await session.commit()
    # Older than an upload's lease: such an upload could not commit any more anyway.
    report.incomplete = await blobs.sweep_incomplete(settings.blob_upload_lease_s)
    return report


async def run_blob_gc(principal: Principal, db: Database, blobs: BlobStore,
                      settings: RegistrySettings,
                      metrics: RegistryMetrics | None = None) -> GcReport:
    """The admin trigger: blobs are shared by every tenant, so only a global admin."""
    if not principal.is_global_admin:
        raise Forbidden("only a global admin may collect blobs", code="forbidden")
    return await collect_garbage(db, blobs, settings, metrics)


class BlobCollector(BackgroundTask):
    """Runs ``collect_garbage`` at start-up and then every ``blob_gc_interval_s``."""

    task_name = "blob-gc"

    def __init__(self, db: Database, blobs: BlobStore, settings: RegistrySettings,
                 metrics: RegistryMetrics | None = None) -> None:
        self._db, self._blobs, self._settings = db, blobs, settings
        self._metrics = metrics

    async def _run(self) -> None:
        while True:
            try:
                report = await collect_garbage(self._db, self._blobs, self._settings,
                                               self._metrics)
                if report.deleted:
                    log.info("blob gc: %s", report.model_dump())
            except RegistryError as exc:
                log.warning("blob gc failed: %s %s; trying again later", exc.message, exc.detail)
            except Exception:
                log.exception("blob gc failed; trying again later")
            await asyncio.sleep(self._settings.blob_gc_interval_s)
