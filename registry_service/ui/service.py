"""What the page shows, read through the other domains' use cases and queries."""

from __future__ import annotations

import json
import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from loraplane.api.agents import RolloutOut
from loraplane.api.aliases import AliasMoveOut
from loraplane.api.canaries import ACTIVE_STATES, Canary, CanaryAnalysis
from loraplane.api.versions import VersionOut
from loraplane.lora.files import CONFIG_FILE
from loraplane.lora.peft_config import MAX_CONFIG_BYTES
from registry_service.adapters.lookup import get_visible_adapter
from registry_service.adapters.models import Adapter
from registry_service.adapters.service import show_adapter
from registry_service.agents.service import DEFAULT_STALE_AFTER_S, tenant_rollouts
from registry_service.aliases.models import Alias
from registry_service.aliases.service import adapter_moves
from registry_service.auth.roles import Principal, Role
from registry_service.blobs.base import BlobStore
from registry_service.canaries.analysis import checks
from registry_service.canaries.models import CanaryRow
from registry_service.canaries.service import canary_out
from registry_service.canaries.traffic import windows
from registry_service.errors import Forbidden, RegistryError
from registry_service.events.service import events_mark
from registry_service.ui.diff import config_changes, file_changes
from registry_service.ui.schemas import (
    RunningCanaries,
    SignedIn,
    Timeline,
    TimelineEntry,
    VersionDetails,
    VersionDiff,
    fleet_json,
)
from registry_service.versions.models import Version
from registry_service.versions.service import list_versions, show_version

log = logging.getLogger(__name__)


def signed_in(principal: Principal) -> SignedIn:
    principal.require(Role.READER)
    try:
        principal.require(Role.PUBLISHER)  # what promote and rollback require
        can_move = True
    except Forbidden:
        can_move = False
    return SignedIn(name=principal.name, role=principal.role.value, tenant=principal.tenant,
                    can_move_aliases=can_move)


async def _read_config(blobs: BlobStore, version: VersionOut) -> dict[str, Any] | None:
    """The version's ``adapter_config.json``, or None if the store cannot give it now."""
    entry = next((f for f in version.files if f.name == CONFIG_FILE), None)
    if entry is None or entry.size > MAX_CONFIG_BYTES:
        return None
    try:
        async with await blobs.open_stream(entry.sha256) as stream:
            data = b"".join([chunk async for chunk in stream])
        document = json.loads(data)
    except (RegistryError, OSError, ValueError) as exc:
        log.warning("could not read %s of %s v%d: %s", CONFIG_FILE, version.adapter,
                    version.version, exc)
        return None
    return document if isinstance(document, dict) else None


async def version_details(session: AsyncSession, principal: Principal, blobs: BlobStore,
                          name: str, number: int) -> VersionDetails:
    version = await show_version(session, principal, name, number)
    await session.rollback()  # no transaction held while the store answers
    return VersionDetails(**version.model_dump(), config=await _read_config(blobs, version))


async def version_diff(session: AsyncSession, principal: Principal, blobs: BlobStore,
                       name: str, base: int, head: int) -> VersionDiff:
    """From version ``base`` to version ``head``: config keys, files and sizes."""
    old = await show_version(session, principal, name, base)
    new = await show_version(session, principal, name, head)
    await session.rollback()
    old_config, new_config = await _read_config(blobs, old), await _read_config(blobs, new)
    config = None if old_config is None or new_config is None \
        else config_changes(old_config, new_config)
    return VersionDiff(adapter=old.adapter, base=base, head=head, config=config,
                       files=file_changes(old.files, new.files),
                       base_size=old.total_size, head_size=new.total_size)


def _version_entry(version: VersionOut) -> TimelineEntry:
    return TimelineEntry(kind="version", at=version.created_at, actor=version.uploader,
                         version=version.version, notes=version.notes,
                         digest=version.digest, total_size=version.total_size)


def _move_entry(alias: str, move: AliasMoveOut) -> TimelineEntry:
    return TimelineEntry(kind="move", at=move.created_at, actor=move.actor, alias=alias,
                         action=move.action, from_version=move.from_version,
                         to_version=move.to_version, version=move.to_version,
                         revision=move.revision)


async def timeline(session: AsyncSession, principal: Principal, name: str,
                   limit: int) -> Timeline:
    """The adapter's uploads and alias moves, newest first, at most ``limit`` of them."""
    adapter_out = await show_adapter(session, principal, name)
    adapter = await get_visible_adapter(session, principal, name)
    versions = await list_versions(session, principal, name, limit=limit, cursor=None)
    moves = await adapter_moves(session, adapter, limit)
    entries = [_version_entry(v) for v in versions.versions]
    entries += [_move_entry(alias, move) for alias, move in moves]
    # A push's moves share their version's time: they come above it, as they follow it.
    entries.sort(key=lambda e: (e.at, e.kind == "move"), reverse=True)
    truncated = versions.next_cursor is not None or len(moves) == limit \
        or len(entries) > limit
    return Timeline(adapter=adapter_out, entries=entries[:limit], truncated=truncated)


async def fleet(session: AsyncSession, principal: Principal, *,
                stale_after_s: float = DEFAULT_STALE_AFTER_S) -> str:
    """The ``Fleet`` the principal may see, as JSON written on a worker thread (a
    thousand adapters' rollouts are megabytes of it)."""
    return await tenant_rollouts(session, principal, written_fleet,
                                 stale_after_s=stale_after_s)


def written_fleet(rollouts: list[RolloutOut]) -> str:
    return fleet_json(rollout.model_dump_json() for rollout in rollouts)


# More running canaries than any page shows: a bound on one look's work, not a limit
# anyone meets (one per alias at most).
MAX_RUNNING_CANARIES = 500


async def running_canaries(session: AsyncSession, principal: Principal) -> RunningCanaries:
    """The running canaries of every adapter the principal may read (reader): a tenant's
    token sees its tenant's only, a global one every tenant's."""
    principal.require(Role.READER)
    scope = None if principal.is_global else principal.tenant_id
    found = await canaries_by_scope(session, {scope})
    return RunningCanaries(canaries=found[scope])


async def canaries_by_scope(session: AsyncSession, tenant_ids: set[int | None]
                            ) -> dict[int | None, list[Canary]]:
    """``running_canaries`` for many scopes (a tenant's id, or None for every tenant) from
    one read: the UI's live streams share it. Each canary comes with its current step's
    window so far, judged as ``GET …/canary`` judges it (``live_checks``)."""
    stable_v, canary_v = aliased(Version), aliased(Version)
    query = (select(CanaryRow, Alias.name, Adapter.name, Adapter.tenant_id, stable_v.number,
                    canary_v.number)
             .join(Alias, Alias.id == CanaryRow.alias_id)
             .join(Adapter, Adapter.id == Alias.adapter_id)
             .join(stable_v, stable_v.id == CanaryRow.stable_version_id)
             .join(canary_v, canary_v.id == CanaryRow.canary_version_id)
             .where(CanaryRow.state.in_(sorted(ACTIVE_STATES)), Adapter.deleted_at.is_(None)))
    if None not in tenant_ids:
        query = query.where(Adapter.tenant_id.in_(sorted(t for t in tenant_ids if t)))
    rows = (await session.execute(
        query.order_by(Adapter.name, Alias.name).limit(MAX_RUNNING_CANARIES))).all()
    found: list[tuple[int, Canary]] = []
    for row, alias, adapter, tenant_id, stable, canary in rows:
        sides = await windows(session, row.id)
        live = checks(sides["stable"], sides["canary"], CanaryAnalysis(**row.analysis))
        found.append((tenant_id, canary_out(adapter, alias, row, stable, canary, live)))
    return {scope: [c for tenant_id, c in found if scope is None or tenant_id == scope]
            for scope in tenant_ids}


async def change_mark(session: AsyncSession, principal: Principal) -> tuple[int, int]:
    """Moves whenever an event the principal may read is written (see ``events_mark``)."""
    principal.require(Role.READER)
    return await events_mark(session, None if principal.is_global else principal.tenant)
