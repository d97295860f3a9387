"""Garbage collection of blobs no version references.

A blob is stored before the transaction that references it commits, so a commit that
fails (the adapter was deleted meanwhile, the database went away) or a registry killed
between the two leaves a blob nothing names. The collector removes such a blob when
all of these hold:

- no version row names it (checked again inside the transaction that claims it);
- no upload holds a lease on it: an upload leases its blobs (``blob_leases``) before it
  stores them and commits only while the lease holds, so a blob an upload in flight is
  about to reference is never taken, even one that was already in the store;
- the store wrote it more than ``blob_gc_grace_s`` ago (a writer that took no lease,
  such as an older registry during a rolling upgrade, has that long to commit).

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
from dataclasses import dataclass
from datetime import timedelta

from pydantic import BaseModel
from sqlalchemy import String, cast, select
from sqlalchemy.ext.asyncio import AsyncSession

from registry_service.auth.roles import Principal
from registry_service.background import BackgroundTask
from registry_service.blobs.base import BlobStore, StoredBlob
from registry_service.blobs.leases import claim_for_collection, drop_expired, release_collection
from registry_service.blobs.referenced import read_referenced
from registry_service.db.base import utcnow
from registry_service.db.engine import Database
from registry_service.errors import Forbidden, RegistryError
from registry_service.settings import RegistrySettings
from registry_service.versions.models import Version

log = logging.getLogger(__name__)

# How long a collector's mark on a blob lasts; a delete is only sent while at least
# DELETE_MARGIN_S of it is left (an S3 call gives up long before that).
CLAIM_S = 120.0
DELETE_MARGIN_S = 60.0


class GcReport(BaseModel):
    examined: int = 0
    referenced: int = 0
    too_young: int = 0
    leased: int = 0
    deleted: int = 0
    # Uploads that never finished (open multipart uploads, temporary objects or files).
    incomplete: int = 0


async def _is_referenced(session: AsyncSession, sha: str) -> bool:
    # The digest is plain hex, so a text search of the JSON cannot match by accident.
    query = select(Version.id).where(cast(Version.files, String).contains(sha)).limit(1)
    return await session.scalar(query) is not None


@dataclass
class _Pass:
    db: Database
    blobs: BlobStore
    report: GcReport

    async def collect(self, blob: StoredBlob) -> None:
        until = utcnow() + timedelta(seconds=CLAIM_S)
        deadline = time.monotonic() + CLAIM_S - DELETE_MARGIN_S
        async with self.db.session() as session:
            if not await claim_for_collection(session, blob.sha256, until):
                self.report.leased += 1
                return
            if await _is_referenced(session, blob.sha256):
                self.report.referenced += 1
                return  # the session rolls the claim back
            await session.commit()
        try:
            if time.monotonic() < deadline:
                await self.blobs.delete(blob.sha256)
                self.report.deleted += 1
                log.info("collected unreferenced blob %s", blob.sha256)
        finally:
            async with self.db.session() as session:
                await release_collection(session, blob.sha256, until)
                await session.commit()


async def collect_garbage(db: Database, blobs: BlobStore, settings: RegistrySettings) -> GcReport:
    """One pass over the store; see the module docstring for what is removed."""
    report = GcReport()
    referenced = await read_referenced(db)
    cutoff = utcnow() - timedelta(seconds=settings.blob_gc_grace_s)
    gc = _Pass(db, blobs, report)
    async for blob in blobs.list_blobs():
        report.examined += 1
        if blob.sha256 in referenced:
            report.referenced += 1
        elif blob.modified > cutoff:
            report.too_young += 1
        else:
            await gc.collect(blob)
    async with db.session() as session:
        await drop_expired(session)
        await session.commit()
    # Older than an upload's lease: such an upload could not commit any more anyway.
    report.incomplete = await blobs.sweep_incomplete(settings.blob_upload_lease_s)
    return report


async def run_blob_gc(principal: Principal, db: Database, blobs: BlobStore,
                      settings: RegistrySettings) -> GcReport:
    """The admin trigger: blobs are shared by every tenant, so only a global admin."""
    if not principal.is_global_admin:
        raise Forbidden("only a global admin may collect blobs", code="forbidden")
    return await collect_garbage(db, blobs, settings)


class BlobCollector(BackgroundTask):
    """Runs ``collect_garbage`` at start-up and then every ``blob_gc_interval_s``."""

    task_name = "blob-gc"

    def __init__(self, db: Database, blobs: BlobStore, settings: RegistrySettings) -> None:
        self._db, self._blobs, self._settings = db, blobs, settings

    async def _run(self) -> None:
        while True:
            try:
                report = await collect_garbage(self._db, self._blobs, self._settings)
                if report.deleted:
                    log.info("blob gc: %s", report.model_dump())
            except RegistryError as exc:
                log.warning("blob gc failed: %s %s; trying again later", exc.message, exc.detail)
            except Exception:
                log.exception("blob gc failed; trying again later")
            await asyncio.sleep(self._settings.blob_gc_interval_s)
