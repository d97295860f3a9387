"""Use cases of versions: publish (upload), history, show, and file downloads."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.events import VersionPublished
from loraplane.lora.errors import AdapterInvalid
from loraplane.lora.shape_change import ShapeChange
from registry_service.adapters.lookup import get_visible_adapter
from registry_service.adapters.models import Adapter
from registry_service.aliases.schemas import AliasState
from registry_service.aliases.service import check_alias_name, lock_alias, move_alias_locked
from registry_service.auth.roles import Principal, Role
from registry_service.blobs import leases
from registry_service.blobs.base import BlobStore, BlobStream
from registry_service.blobs.models import version_blobs
from registry_service.errors import BadRequest, NotFound, RegistryError, Unavailable
from registry_service.events.service import envelope, record_event
from registry_service.metrics import RegistryMetrics
from registry_service.settings import RegistrySettings
from registry_service.versions.history import history_page
from registry_service.versions.lookup import get_version
from registry_service.versions.models import Version
from registry_service.versions.refs import version_ref
from registry_service.versions.schemas import UploadResult, VersionOut, VersionPage
from registry_service.versions.shape_guard import current_versions, find_change
from registry_service.versions.slots import UploadSlots
from registry_service.versions.staging import (
    StagedVersion,
    local_disk_errors,
    stage_version,
    staging_area,
)
from registry_service.versions.upload import (
    StreamedFile,
    StreamTarget,
    UploadBody,
    UploadLimits,
    receive_upload,
)
from registry_service.versions.upload_sinks import ReceivedFile

log = logging.getLogger(__name__)


def parse_aliases(raw: str | None) -> list[str]:
    if raw is None:
        return []
    aliases = [a.strip() for a in raw.split(",") if a.strip()]
    for alias in aliases:
        check_alias_name(alias)
    return list(dict.fromkeys(aliases))


def parse_flag(fields: dict[str, str], name: str) -> bool:
    """A true/false form field; absent is false."""
    raw = fields.get(name, "").strip().lower()
    if raw in ("", "false", "0", "no"):
        return False
    if raw in ("true", "1", "yes"):
        return True
    raise BadRequest(f"form field {name!r} must be true or false", code="invalid_field",
                     detail={"field": name, "value": raw[:64]})


def version_out(adapter: Adapter, version: Version) -> VersionOut:
    ref = version_ref(adapter, version)
    return VersionOut(
        adapter=adapter.name, version=version.number, digest=version.digest,
        base_model=adapter.base_model, rank=version.rank, alpha=version.alpha,
        target_modules=ref.target_modules, files=ref.files, total_size=version.total_size,
        uploader=version.uploader, notes=version.notes, created_at=version.created_at,
    )


async def store_blobs(blobs: BlobStore, files: list[ReceivedFile],
                      streams: dict[str, StreamedFile]) -> None:
    """Make every file a blob: a streamed one is finished (completed, or copied to its
    key), one in staging is put. Both skip content already stored. The caller holds a
    lease on every digest, so the collector leaves them be.

    One after the other: the first failure ends the upload at once. Side by side, a
    store that hangs (a paused S3) held the answer for the slowest call's whole timeout,
    and a finish still under way in its thread would race the abort."""
    for item in files:
        if item.path is None:
            await streams[item.name].writer.finish(item.sha256, item.size)
        else:
            await blobs.put_file(item.sha256, item.path, item.size)


# The collector marks a blob for at most two minutes (blobs/gc.py: CLAIM_S).
LEASE_WAIT_S = 150.0
LEASE_RETRY_S = 0.2


async def lease_blobs(session: AsyncSession, files: list[ReceivedFile],
                      settings: RegistrySettings) -> None:
    """Lease the upload's blobs in a short transaction of their own, before storing them.

    A blob the collector is deleting right now is waited for, then stored again.
    """
    shas = [item.sha256 for item in files]
    deadline = time.monotonic() + LEASE_WAIT_S
    while busy := await leases.hold(session, shas, settings.blob_upload_lease_s):
        await session.rollback()
        if time.monotonic() > deadline:
            raise Unavailable("a blob of this upload is being garbage-collected",
                              code="blob_being_collected", detail={"sha256": busy[0]})
        await asyncio.sleep(LEASE_RETRY_S)
    await session.commit()


async def publish_version(
    session: AsyncSession, principal: Principal, name: str, *, blobs: BlobStore,
    settings: RegistrySettings, body: UploadBody, slots: UploadSlots,
    metrics: RegistryMetrics,
) -> UploadResult:
    """Receive, validate and store a version, then move its aliases, in one commit.

    Counts the bytes received, the versions created and every refusal by its code.
    """
    try:
        result = await _admit(session, principal, name, blobs=blobs, settings=settings,
                              body=body, slots=slots, metrics=metrics)
    except (RegistryError, AdapterInvalid) as exc:
        metrics.uploads_refused.labels(exc.code).inc()
        metrics.uploads.labels("refused").inc()
        raise
    metrics.uploads.labels("created" if result.created else "unchanged").inc()
    if result.created:
        metrics.versions_created.inc()
    return result


async def _admit(
    session: AsyncSession, principal: Principal, name: str, *, blobs: BlobStore,
    settings: RegistrySettings, body: UploadBody, slots: UploadSlots,
    metrics: RegistryMetrics,
) -> UploadResult:
    """The caller is checked before the body is read, so a refused upload is not
    streamed to disk first; one over its token's uploads in flight is refused then too."""
    with metrics.upload_phase.labels("admit").time():
        principal.require(Role.PUBLISHER)
        base_model = (await get_visible_adapter(session, principal, name)).base_model
        # Hold no transaction (on SQLite: no write lock) while the body streams in.
        await session.rollback()
    with slots.hold(principal.token_id, settings.max_uploads_per_token):
        return await _publish(session, principal, name, blobs=blobs, settings=settings,
                              body=body, base_model=base_model, metrics=metrics)


async def _publish(
    session: AsyncSession, principal: Principal, name: str, *, blobs: BlobStore,
    settings: RegistrySettings, body: UploadBody, base_model: str,
    metrics: RegistryMetrics,
) -> UploadResult:
    limits = UploadLimits(settings.max_file_bytes, settings.max_upload_bytes)
    stream = StreamTarget(blobs.open_writer, settings.max_header_bytes)
    phase = metrics.upload_phase.labels
    async with staging_area(settings.staging_dir) as staging:
        with local_disk_errors(), phase("receive").time():
            upload = await receive_upload(body, staging, limits,
                                          on_bytes=metrics.upload_bytes.inc, stream=stream)
        try:
            with phase("validate").time():
                with local_disk_errors():
                    aliases = parse_aliases(upload.fields.get("aliases"))
                    allow = parse_flag(upload.fields, "allow_shape_change")
                    abort_canary = parse_flag(upload.fields, "abort_canary")
                    staged = await stage_version(upload, staging, settings, base_model)
                change = await _shape_change(session, principal, name, staged, blobs,
                                             settings)
                if change is not None and not allow:
                    raise change.refusal()
            notes = upload.fields.get("notes", "")
            with phase("lease").time():
                await lease_blobs(session, staged.files, settings)
            committed = False
            try:
                with phase("store").time():
                    await store_blobs(blobs, staged.files, upload.streams)
                with phase("commit").time():
                    result = await _commit_version(session, principal, name, staged,
                                                   aliases, notes, abort_canary)
                committed = True  # the commit gave the leases back
                return result if change is None else _overridden(result, change)
            finally:
                if not committed:
                    await release_blobs(session, staged.files)
        finally:
            # A refused upload's streamed blob is discarded: no object, no open upload.
            await upload.abort_streams()


async def _shape_change(session: AsyncSession, principal: Principal, name: str,
                        staged: StagedVersion, blobs: BlobStore,
                        settings: RegistrySettings) -> ShapeChange | None:
    """How the upload's tensors differ from the adapter's current versions', if they do."""
    try:
        adapter = await get_visible_adapter(session, principal, name)
    except NotFound:
        await session.rollback()
        return None  # deleted while the body streamed: the commit refuses the upload
    versions = await current_versions(session, adapter, staged.digest)
    await session.rollback()  # no transaction held while blobs are read
    return await find_change(blobs, versions, staged.summary.features,
                             max_header_bytes=settings.max_header_bytes)


def _overridden(result: UploadResult, change: ShapeChange) -> UploadResult:
    warning = f"{change.describe()}; accepted because allow_shape_change was set"
    return result.model_copy(update={"warnings": [*result.warnings, warning],
                                     "shape_change_allowed": True})


async def _commit_version(
    session: AsyncSession, principal: Principal, name: str, staged: StagedVersion,
    aliases: list[str], notes: str, abort_canary: bool,
) -> UploadResult:
    """The version and its moves, with the upload's blob leases given back in the same
    commit: once the version references its blobs, the leases have nothing left to keep."""
    async def commit() -> UploadResult:
        result = await _add_version(session, principal, name, staged, aliases, notes,
                                    abort_canary)
        await leases.release(session, [item.sha256 for item in staged.files])
        await session.commit()
        return result

    try:
        return await commit()
    except IntegrityError:
        # A concurrent identical upload won the race; ours is now a re-upload.
        await session.rollback()
        return await commit()


async def release_blobs(session: AsyncSession, files: list[ReceivedFile]) -> None:
    """Give the upload's leases back, committed or refused: a refused upload's blobs are
    then the collector's. Best effort: a lease not given back runs out on its own."""
    try:
        await session.rollback()
        await leases.release(session, [item.sha256 for item in files])
        await session.commit()
    except (RegistryError, SQLAlchemyError) as exc:
        log.warning("could not release the blob leases of an upload: %s", exc)


async def _add_version(
    session: AsyncSession, principal: Principal, name: str, staged: StagedVersion,
    aliases: list[str], notes: str, abort_canary: bool,
) -> UploadResult:
    """The version row (unless this content is already one), its ``version_published``
    event and the alias moves, in the caller's transaction. Never commits."""
    adapter = await get_visible_adapter(session, principal, name, for_update=True)
    await leases.require_held(session, [item.sha256 for item in staged.files])
    version = await session.scalar(
        select(Version).where(Version.adapter_id == adapter.id, Version.digest == staged.digest)
    )
    created = version is None
    if version is None:
        version = _new_version(adapter, staged, principal, notes)
        session.add(version)
        await session.flush()
        # The blobs it names, in the same commit: the collector asks this table.
        session.add_all(version_blobs(version.id, (item.sha256 for item in staged.files)))
        event = VersionPublished(**envelope(adapter.tenant.name, adapter.name),
                                 base_model=adapter.base_model,
                                 target=version_ref(adapter, version))
        record_event(session, event, actor=principal.name)
    states: list[AliasState] = []
    for alias_name in aliases:
        alias = await lock_alias(session, adapter, alias_name)
        states.append(await move_alias_locked(session, adapter, alias, version,
                                              action="publish", actor=principal.name,
                                              abort_canary=abort_canary))
    out = version_out(adapter, version)
    return UploadResult(**out.model_dump(), created=created, aliases=states,
                        warnings=list(staged.summary.warnings),
                        checks=list(staged.summary.notes))


def _new_version(adapter: Adapter, staged: StagedVersion, principal: Principal,
                 notes: str) -> Version:
    # The adapter row is locked, so this number is ours alone.
    adapter.last_version += 1
    summary = staged.summary
    return Version(
        adapter_id=adapter.id, number=adapter.last_version, digest=staged.digest,
        files=staged.files_json(), total_size=staged.total_size, rank=summary.rank,
        alpha=float(summary.alpha), target_modules=list(summary.target_modules),
        uploader=principal.name, notes=notes,
    )


async def list_versions(
    session: AsyncSession, principal: Principal, name: str, *, limit: int, cursor: str | None
) -> VersionPage:
    """``history_page`` as a model, for callers in the registry (the /ui)."""
    page = await history_page(session, principal, name, limit=limit, cursor=cursor)
    return VersionPage.model_validate_json(page)


async def show_version(
    session: AsyncSession, principal: Principal, name: str, number: int
) -> VersionOut:
    principal.require(Role.READER)
    adapter = await get_visible_adapter(session, principal, name)
    return version_out(adapter, await get_version(session, adapter, number))


@dataclass(frozen=True, slots=True)
class FileDownload:
    filename: str
    sha256: str
    size: int
    redirect_url: str | None
    stream: BlobStream | None


async def open_file(
    session: AsyncSession, principal: Principal, name: str, number: int, filename: str, *,
    blobs: BlobStore, settings: RegistrySettings,
) -> FileDownload:
    principal.require(Role.READER)
    adapter = await get_visible_adapter(session, principal, name)
    version = await get_version(session, adapter, number)
    entry = next((f for f in version.files if f["name"] == filename), None)
    if entry is None:
        raise NotFound(f"version {number} of {name!r} has no file {filename!r}",
                       code="file_not_found", detail={"file": filename})
    await session.rollback()
    sha, size = str(entry["sha256"]), int(entry["size"])
    url = await blobs.presigned_url(sha, filename=filename, expires_s=settings.presign_expires_s)
    stream = None if url else await blobs.open_stream(sha)
    return FileDownload(filename=filename, sha256=sha, size=size, redirect_url=url,
                        stream=stream)
