"""Alias moves: promote, rollback, delete, and the moves a push makes.

Every move bumps the alias's revision, is recorded in ``alias_moves`` and writes an
``adapter_updated`` event in the same transaction. The other domains read and move
aliases through this module too (``alias_versions``, ``alias_targets``,
``remove_all_aliases``).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, Row, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from loraplane.events import CANARY_HOLDS, AdapterUpdated, AliasAction, CanaryRoute
from loraplane.naming import is_slug
from registry_service.adapters.lookup import get_visible_adapter
from registry_service.adapters.models import Adapter
from registry_service.aliases.models import Alias, AliasMove
from registry_service.aliases.schemas import AliasHistory, AliasMoveOut, AliasState
from registry_service.auth.roles import Principal, Role
from registry_service.canaries.state import active_canary, finish
from registry_service.cursors import int_cursor
from registry_service.db.base import utcnow
from registry_service.errors import Conflict, InvalidInput, NotFound
from registry_service.events.service import envelope, record_event
from registry_service.versions.lookup import get_version, version_by_id
from registry_service.versions.models import Version
from registry_service.versions.refs import version_ref


def check_alias_name(name: str) -> None:
    if not is_slug(name) or name.isdigit():
        raise InvalidInput(f"alias {name!r} must be a slug that is not a number",
                           code="invalid_alias", detail={"alias": name})


async def lock_alias(session: AsyncSession, adapter: Adapter, name: str) -> Alias:
    """The alias row, locked for this transaction; created (pointing nowhere) if new."""
    check_alias_name(name)
    query = select(Alias).where(Alias.adapter_id == adapter.id, Alias.name == name)
    alias = await session.scalar(query.with_for_update())
    if alias is not None:
        return alias
    try:
        async with session.begin_nested():
            alias = Alias(adapter_id=adapter.id, name=name, version_id=None, revision=0)
            session.add(alias)
    except IntegrityError:
        alias = await session.scalar(query.with_for_update())
        if alias is None:
            raise
    return alias


async def move_alias_locked(
    session: AsyncSession, adapter: Adapter, alias: Alias, target: Version | None, *,
    action: AliasAction, actor: str, abort_canary: bool = False, reason: str | None = None,
) -> AliasState:
    """Point a locked alias at ``target`` (None removes it). A canary running on the
    alias refuses the move (409 ``canary_running``), unless ``abort_canary`` or the
    adapter's deletion ends it first. Never commits."""
    previous = await version_by_id(session, alias.version_id)
    state = AliasState(adapter=adapter.name, alias=alias.name,
                       version=target.number if target else None,
                       previous_version=previous.number if previous else None,
                       revision=alias.revision, changed=False)
    if (target.id if target else None) == alias.version_id:
        return state
    if action != "canary_promote":
        await _end_canary(session, adapter, alias, previous, action=action, actor=actor,
                          abort=abort_canary or action == "adapter_deleted")
    alias.version_id = target.id if target else None
    _bump(session, adapter, alias, previous, target, action=action, actor=actor,
          reason=reason)
    return state.model_copy(update={"revision": alias.revision, "changed": True})


async def _end_canary(
    session: AsyncSession, adapter: Adapter, alias: Alias, current: Version | None, *,
    action: str, actor: str, abort: bool,
) -> None:
    canary = await active_canary(session, alias.id)
    if canary is None:
        return
    if not abort:
        raise Conflict(
            f"alias {alias.name!r} has canary {canary.id} running: abort it first, or "
            "ask for the move with abort_canary",
            code="canary_running", detail={"alias": alias.name, "canary": canary.id})
    why = ("the adapter was deleted" if action == "adapter_deleted"
           else f"the alias was moved by hand ({action})")
    reason = f"aborted by {actor}: {why}"
    finish(canary, promoted=False, reason=reason, actor=actor)
    record_transition(session, adapter, alias, current, action="canary_abort", actor=actor,
                      reason=reason, canary=None)


def record_transition(
    session: AsyncSession, adapter: Adapter, alias: Alias, current: Version | None, *,
    action: AliasAction, actor: str, reason: str | None, canary: CanaryRoute | None,
) -> None:
    """A canary's transition that leaves the alias's version where it is: a revision of
    its own, in the alias's history and the events. Never commits."""
    _bump(session, adapter, alias, current, current, action=action, actor=actor,
          reason=reason, canary=canary)


def _bump(
    session: AsyncSession, adapter: Adapter, alias: Alias, previous: Version | None,
    target: Version | None, *, action: AliasAction, actor: str, reason: str | None = None,
    canary: CanaryRoute | None = None,
) -> None:
    alias.revision += 1
    alias.updated_at = utcnow()
    session.add(AliasMove(alias_id=alias.id, revision=alias.revision, action=action,
                          from_version_id=previous.id if previous else None,
                          to_version_id=alias.version_id, actor=actor, reason=reason))
    ref = version_ref(adapter, target) if target else None
    event = AdapterUpdated(
        **envelope(adapter.tenant.name, adapter.name), alias=alias.name,
        revision=alias.revision, action=action, base_model=adapter.base_model,
        version=target.number if target else None,
        previous_version=previous.number if previous else None,
        digest=target.digest if target else None, rank=target.rank if target else None,
        files=ref.files if ref else [], target=ref, canary=canary, reason=reason,
    )
    record_event(session, event, actor=actor)


def _check_revision(alias: Alias, expected: int | None) -> None:
    if expected is not None and expected != alias.revision:
        raise Conflict(
            f"alias {alias.name!r} is at revision {alias.revision}, not {expected}",
            code="revision_conflict",
            detail={"alias": alias.name, "revision": alias.revision, "expected": expected},
        )


async def promote(
    session: AsyncSession, principal: Principal, name: str, alias_name: str, version: int,
    expected_revision: int | None, *, abort_canary: bool = False,
) -> AliasState:
    principal.require(Role.PUBLISHER)
    adapter = await get_visible_adapter(session, principal, name)
    target = await get_version(session, adapter, version)
    alias = await lock_alias(session, adapter, alias_name)
    _check_revision(alias, expected_revision)
    state = await move_alias_locked(session, adapter, alias, target, action="promote",
                                    actor=principal.name, abort_canary=abort_canary)
    await session.commit()
    return state


async def remove_alias(
    session: AsyncSession, principal: Principal, name: str, alias_name: str, *,
    abort_canary: bool = False,
) -> AliasState:
    principal.require(Role.PUBLISHER)
    adapter = await get_visible_adapter(session, principal, name)
    alias = await existing_alias(session, adapter, alias_name)
    state = await move_alias_locked(session, adapter, alias, None, action="delete",
                                    actor=principal.name, abort_canary=abort_canary)
    await session.commit()
    return state


async def existing_alias(session: AsyncSession, adapter: Adapter, alias_name: str) -> Alias:
    alias = await session.scalar(
        select(Alias).where(Alias.adapter_id == adapter.id, Alias.name == alias_name)
        .with_for_update()
    )
    if alias is None or alias.version_id is None:
        raise NotFound(f"alias {alias_name!r} of {adapter.name!r} not found",
                       code="alias_not_found", detail={"alias": alias_name})
    return alias


async def rollback(
    session: AsyncSession, principal: Principal, name: str, alias_name: str,
    expected_revision: int | None, *, abort_canary: bool = False,
) -> AliasState:
    """Undo the alias's latest move that no rollback has undone yet.

    The moves form an undo stack: every move but a rollback is pushed, and a rollback
    pops one, pointing the alias back at that move's ``from`` version. So v1, v2, v3
    followed by rollbacks goes to v2, then v1, then answers 409 ``no_previous_version``
    (nothing before v1); a promote after a rollback is the next move undone.
    """
    principal.require(Role.PUBLISHER)
    adapter = await get_visible_adapter(session, principal, name)
    alias = await existing_alias(session, adapter, alias_name)
    _check_revision(alias, expected_revision)
    undone_from = await _move_to_undo(session, alias)
    if undone_from is None:
        raise Conflict(f"alias {alias_name!r} has no previous version to go back to",
                       code="no_previous_version", detail={"alias": alias_name})
    target = await version_by_id(session, undone_from)
    state = await move_alias_locked(session, adapter, alias, target, action="rollback",
                                    actor=principal.name, abort_canary=abort_canary)
    await session.commit()
    return state


# Moves a rollback reads at a time while it looks for the move to undo.
UNDO_SCAN_PAGE = 100


async def _move_to_undo(session: AsyncSession, alias: Alias) -> int | None:
    """The ``from`` version of the latest move not undone by a rollback, if any.

    Walked newest first, as brackets: each rollback undid the latest earlier move that
    was not undone yet, so the answer is the newest non-rollback move that no later
    rollback matches. The moves come a page at a time off the (alias_id, revision)
    index, so a rollback reads a few rows however long the alias's history is (it holds
    the alias's row lock, and on SQLite the write lock, meanwhile)."""
    pending = 0
    before: int | None = None
    while True:
        query = select(AliasMove.revision, AliasMove.action, AliasMove.from_version_id) \
            .where(AliasMove.alias_id == alias.id)
        if before is not None:
            query = query.where(AliasMove.revision < before)
        rows = (await session.execute(
            query.order_by(AliasMove.revision.desc()).limit(UNDO_SCAN_PAGE))).all()
        for _, action, from_version_id in rows:
            if action in CANARY_HOLDS:  # the alias stayed where it was
                continue
            if action == "rollback":
                pending += 1
            elif pending:
                pending -= 1
            else:
                return from_version_id
        if len(rows) < UNDO_SCAN_PAGE:
            return None
        before = rows[-1].revision


async def alias_history(
    session: AsyncSession, principal: Principal, name: str, alias_name: str, limit: int,
    cursor: str | None = None,
) -> AliasHistory:
    """The alias's moves, newest first, ``limit`` at a time; ``cursor`` (a revision)
    continues below the page that handed it out."""
    principal.require(Role.READER)
    before = int_cursor(cursor)
    adapter = await get_visible_adapter(session, principal, name)
    alias = await session.scalar(
        select(Alias).where(Alias.adapter_id == adapter.id, Alias.name == alias_name))
    moves = [] if alias is None else await _alias_moves(session, alias.id, limit + 1, before)
    if not moves and (alias is None or (alias.version_id is None and before is None)):
        raise NotFound(f"alias {alias_name!r} of {adapter.name!r} not found",
                       code="alias_not_found", detail={"alias": alias_name})
    page = [move for _, move in moves[:limit]]
    next_cursor = str(page[-1].revision) if len(moves) > limit else None
    return AliasHistory(adapter=adapter.name, alias=alias_name, moves=page,
                        next_cursor=next_cursor)


async def adapter_moves(
    session: AsyncSession, adapter: Adapter, limit: int
) -> list[tuple[str, AliasMoveOut]]:
    """The latest ``limit`` moves of every alias of ``adapter`` (removed ones included),
    newest first, each with its alias's name."""
    aliases = await session.execute(
        select(Alias.id, Alias.name).where(Alias.adapter_id == adapter.id))
    # Each alias's newest moves come off its (alias_id, revision) index and are merged
    # here: one ORDER BY over the adapter's moves would read them all to sort them.
    merged: list[tuple[int, str, AliasMoveOut]] = []
    for alias_id, alias_name in aliases.all():
        merged += [(move_id, alias_name, move)
                   for move_id, move in await _alias_moves(session, alias_id, limit, None)]
    merged.sort(key=lambda item: item[0], reverse=True)
    return [(alias_name, move) for _, alias_name, move in merged[:limit]]


async def _alias_moves(
    session: AsyncSession, alias_id: int, limit: int, before: int | None
) -> list[tuple[int, AliasMoveOut]]:
    """One alias's moves below revision ``before``, newest first, with their ids.

    An alias's moves are serialized by its row lock, so its revisions order them; the
    (alias_id, revision) index hands them out in that order and the scan stops at
    ``limit``, however long the alias's history is."""
    from_v, to_v = aliased(Version), aliased(Version)
    query = (
        select(AliasMove, from_v.number, to_v.number)
        .outerjoin(from_v, from_v.id == AliasMove.from_version_id)
        .outerjoin(to_v, to_v.id == AliasMove.to_version_id)
        .where(AliasMove.alias_id == alias_id)
    )
    if before is not None:
        query = query.where(AliasMove.revision < before)
    rows = await session.execute(query.order_by(AliasMove.revision.desc()).limit(limit))
    return [(m.id, AliasMoveOut(revision=m.revision, action=m.action, from_version=f,
                                to_version=t, actor=m.actor, created_at=m.created_at,
                                reason=m.reason))
            for m, f, t in rows]


async def alias_versions(
    session: AsyncSession, adapter: Adapter, *, removed: bool = False
) -> list[tuple[Alias, int | None]]:
    """The adapter's aliases by name with the number of the version each points at;
    with ``removed``, also the removed ones (their row stays, pointing nowhere)."""
    query = (select(Alias, Version.number)
             .outerjoin(Version, Version.id == Alias.version_id)
             .where(Alias.adapter_id == adapter.id).order_by(Alias.name))
    if not removed:
        query = query.where(Alias.version_id.is_not(None))
    return [(alias, number) for alias, number in await session.execute(query)]


async def aliases_by_adapter(
    session: AsyncSession, adapter_ids: Sequence[int]
) -> dict[int, list[tuple[Alias, int | None]]]:
    """``alias_versions(..., removed=True)`` of many adapters in one query, by adapter id
    (an adapter without aliases maps to an empty list)."""
    found: dict[int, list[tuple[Alias, int | None]]] = {i: [] for i in adapter_ids}
    if not adapter_ids:
        return found
    rows = await session.execute(
        select(Alias, Version.number).outerjoin(Version, Version.id == Alias.version_id)
        .where(Alias.adapter_id.in_(adapter_ids)).order_by(Alias.adapter_id, Alias.name))
    for alias, number in rows:
        found[alias.adapter_id].append((alias, number))
    return found


async def alias_targets(
    session: AsyncSession, where: Sequence[ColumnElement[bool]]
) -> Sequence[Row[Alias, Version]]:
    """Every alias that points at a version, with that version, for the adapters
    matching ``where`` (conditions on ``Adapter``), ordered by adapter and name."""
    # Removed aliases keep their row with no version; the inner join leaves them out.
    query = (
        select(Alias, Version)
        .join(Version, Alias.version_id == Version.id)
        .join(Adapter, Alias.adapter_id == Adapter.id)
        .where(*where)
        .order_by(Alias.adapter_id, Alias.name)
    )
    return (await session.execute(query)).all()


async def remove_all_aliases(
    session: AsyncSession, adapter: Adapter, *, action: AliasAction, actor: str
) -> None:
    """Point every alias of ``adapter`` nowhere, one recorded move each. Never commits."""
    aliases = await session.scalars(
        select(Alias).where(Alias.adapter_id == adapter.id, Alias.version_id.is_not(None))
        .with_for_update()
    )
    for alias in list(aliases):
        await move_alias_locked(session, adapter, alias, None, action=action, actor=actor)
