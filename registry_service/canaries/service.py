"""Canaries of an alias: start, read, pause, resume, promote, abort and list them.

Each transition locks the alias's row, changes the canary and records the transition
as a revision of the alias (its history and an ``adapter_updated`` event carrying the
canary's route), in one commit. Only promotion moves the alias itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from loraplane.api.canaries import (
    ACTIVE_STATES,
    Canary,
    CanaryAnalysis,
    CanaryCheck,
    CanaryList,
    CanaryStart,
)
from loraplane.events import AliasAction, CanaryRoute
from registry_service.adapters.lookup import get_visible_adapter
from registry_service.adapters.models import Adapter
from registry_service.aliases.models import Alias
from registry_service.aliases.service import (
    existing_alias,
    move_alias_locked,
    record_transition,
)
from registry_service.auth.roles import Principal, Role
from registry_service.canaries.analysis import checks
from registry_service.canaries.models import CanaryRow
from registry_service.canaries.prometheus import check_source
from registry_service.canaries.state import active_canary, canary_route, finish
from registry_service.canaries.traffic import rebase, windows
from registry_service.canaries.webhooks import check_hosts
from registry_service.cursors import int_cursor
from registry_service.db.base import utcnow
from registry_service.errors import Conflict, InvalidInput, NotFound
from registry_service.versions.lookup import get_version, version_by_id
from registry_service.versions.models import Version


@dataclass
class Running:
    """A running canary with its alias (locked) and both versions."""

    session: AsyncSession
    adapter: Adapter
    alias: Alias
    row: CanaryRow
    stable: Version
    canary: Version

    def out(self) -> Canary:
        return canary_out(self.adapter.name, self.alias.name, self.row, self.stable.number,
                    self.canary.number)

    def route(self) -> CanaryRoute:
        return canary_route(self.adapter, self.row, self.canary)

    def record(self, action: AliasAction, actor: str, reason: str,
               route: CanaryRoute | None) -> None:
        """The transition, as a revision of the alias. Never commits."""
        self.row.updated_at = utcnow()
        record_transition(self.session, self.adapter, self.alias, self.stable, action=action,
                          actor=actor, reason=reason, canary=route)

    async def promote(self, actor: str, reason: str) -> None:
        """All traffic to the canary version: the alias moves to it, one move."""
        finish(self.row, promoted=True, reason=reason, actor=actor)
        await move_alias_locked(self.session, self.adapter, self.alias, self.canary,
                                action="canary_promote", actor=actor, reason=reason)

    def abort(self, actor: str, reason: str) -> None:
        """No traffic to the canary version; the alias stays where it was."""
        finish(self.row, promoted=False, reason=reason, actor=actor)
        self.record("canary_abort", actor, reason, None)


def canary_out(adapter: str, alias: str, row: CanaryRow, stable: int, canary: int,
               live: list[CanaryCheck] | None = None) -> Canary:
    """The canary object of ``row``, with ``live`` as its ``live_checks``."""
    return Canary(
        id=row.id, adapter=adapter, alias=alias, stable_version=stable,
        canary_version=canary, state=row.state,
        step=row.step, weight=row.weight, steps=list(row.steps),
        step_seconds=row.step_seconds, analysis=CanaryAnalysis(**row.analysis),
        on_failure=row.on_failure, checks=list(row.checks), live_checks=live,
        reason=row.reason, actor=row.actor, started_at=row.started_at,
        updated_at=row.updated_at)


async def start(session: AsyncSession, principal: Principal, name: str, alias_name: str,
                body: CanaryStart, *, webhook_hosts: list[str], prometheus: bool) -> Canary:
    """Put ``body.version`` on the alias at its first step's weight (publisher); with
    ``pre`` webhook gates, at step 0 (no traffic) until they pass. ``prometheus``: the
    registry has one to read metrics from."""
    principal.require(Role.PUBLISHER)
    check_hosts(body.analysis.webhooks, webhook_hosts)
    check_source(body.analysis.source, body.analysis.queries, prometheus)
    adapter = await get_visible_adapter(session, principal, name)
    alias = await existing_alias(session, adapter, alias_name)
    stable = await version_by_id(session, alias.version_id)
    version = await get_version(session, adapter, body.version)
    if stable is None or version.id == stable.id:
        raise InvalidInput(f"version {body.version} is what {alias_name!r} already serves",
                           code="canary_is_stable",
                           detail={"alias": alias_name, "version": body.version})
    running = await active_canary(session, alias.id)
    if running is not None:
        raise Conflict(f"alias {alias_name!r} already runs canary {running.id}",
                       code="canary_exists", detail={"alias": alias_name, "canary": running.id})
    gated = any(hook.phase == "pre" for hook in body.analysis.webhooks)
    row = CanaryRow(alias_id=alias.id, stable_version_id=stable.id,
                    canary_version_id=version.id, state="progressing", step=0 if gated else 1,
                    weight=0 if gated else body.steps[0], steps=list(body.steps),
                    step_seconds=body.step_seconds, analysis=body.analysis.model_dump(),
                    on_failure=body.on_failure, checks=[], actor=principal.name)
    session.add(row)
    await session.flush()
    canary = Running(session, adapter, alias, row, stable, version)
    row.reason = (f"started by {principal.name}: version {version.number} on "
                  + (f"{row.weight}% of {alias_name!r}" if not gated else
                     f"{alias_name!r} once its gates before the first step pass"))
    canary.record("canary_start", principal.name, row.reason, canary.route())
    await session.commit()
    return canary.out()


async def current(session: AsyncSession, principal: Principal, name: str,
                  alias_name: str) -> Canary:
    """The alias's running canary (reader), with the checks of its step's window so
    far; 404 ``no_canary`` when none runs."""
    principal.require(Role.READER)
    canary = await _running(session, principal, name, alias_name, lock=False)
    sides = await windows(session, canary.row.id)
    live = checks(sides["stable"], sides["canary"], CanaryAnalysis(**canary.row.analysis))
    return canary.out().model_copy(update={"live_checks": live})


async def pause(session: AsyncSession, principal: Principal, name: str, alias_name: str,
                reason: str | None) -> Canary:
    """Hold the canary at its weight until resumed (publisher)."""
    return await _switch(session, principal, name, alias_name, reason, to="paused")


async def resume(session: AsyncSession, principal: Principal, name: str, alias_name: str,
                 reason: str | None) -> Canary:
    """Go on from a pause: the step's window starts again (publisher)."""
    return await _switch(session, principal, name, alias_name, reason, to="progressing")


# Target state -> (the state it leaves, the refusal's code, the verb, the transition).
_SWITCHES: dict[str, tuple[str, str, str, AliasAction]] = {
    "paused": ("progressing", "canary_not_progressing", "paused", "canary_pause"),
    "progressing": ("paused", "canary_not_paused", "resumed", "canary_resume"),
}


async def _switch(session: AsyncSession, principal: Principal, name: str, alias_name: str,
                  reason: str | None, *, to: str) -> Canary:
    was, code, verb, action = _SWITCHES[to]
    canary = await _acting(session, principal, name, alias_name)
    if canary.row.state != was:
        raise Conflict(f"canary {canary.row.id} is {canary.row.state}, not {was}",
                       code=code, detail={"canary": canary.row.id})
    canary.row.state = to
    if to == "progressing":  # a window of its own, and the inconclusive ones forgotten
        canary.row.step_started_at = canary.row.window_started_at = utcnow()
        canary.row.inconclusive = 0
        await rebase(session, canary.row.id)
    canary.row.reason = _said(f"{verb} by {principal.name}", reason)
    canary.record(action, principal.name, canary.row.reason, canary.route())
    await session.commit()
    return canary.out()


async def promote(session: AsyncSession, principal: Principal, name: str, alias_name: str,
                  reason: str | None) -> Canary:
    """All traffic to the canary version now: the alias moves to it, one move."""
    canary = await _acting(session, principal, name, alias_name)
    await canary.promote(principal.name, _said(f"promoted by {principal.name}", reason))
    await session.commit()
    return canary.out()


async def abort(session: AsyncSession, principal: Principal, name: str, alias_name: str,
                reason: str | None) -> Canary:
    """No traffic to the canary version: the alias stays where it was (publisher)."""
    canary = await _acting(session, principal, name, alias_name)
    canary.abort(principal.name, _said(f"aborted by {principal.name}", reason))
    await session.commit()
    return canary.out()


async def history(session: AsyncSession, principal: Principal, name: str, alias_name: str,
                  limit: int, cursor: str | None) -> CanaryList:
    """The alias's canaries, newest first, ``limit`` at a time (reader)."""
    principal.require(Role.READER)
    before = int_cursor(cursor)
    adapter = await get_visible_adapter(session, principal, name)
    alias = await session.scalar(
        select(Alias).where(Alias.adapter_id == adapter.id, Alias.name == alias_name))
    if alias is None:
        raise NotFound(f"alias {alias_name!r} of {adapter.name!r} not found",
                       code="alias_not_found", detail={"alias": alias_name})
    stable_v, canary_v = aliased(Version), aliased(Version)
    query = (select(CanaryRow, stable_v.number, canary_v.number)
             .join(stable_v, stable_v.id == CanaryRow.stable_version_id)
             .join(canary_v, canary_v.id == CanaryRow.canary_version_id)
             .where(CanaryRow.alias_id == alias.id))
    if before is not None:
        query = query.where(CanaryRow.id < before)
    rows = (await session.execute(query.order_by(CanaryRow.id.desc()).limit(limit + 1))).all()
    page = [canary_out(adapter.name, alias_name, row, stable, canary)
            for row, stable, canary in rows[:limit]]
    return CanaryList(adapter=adapter.name, alias=alias_name, canaries=page,
                      next_cursor=str(page[-1].id) if len(rows) > limit else None)


async def _acting(session: AsyncSession, principal: Principal, name: str,
                  alias_name: str) -> Running:
    principal.require(Role.PUBLISHER)
    return await _running(session, principal, name, alias_name, lock=True)


async def _running(session: AsyncSession, principal: Principal, name: str, alias_name: str,
                   *, lock: bool) -> Running:
    adapter = await get_visible_adapter(session, principal, name)
    query = select(Alias).where(Alias.adapter_id == adapter.id, Alias.name == alias_name)
    alias = await session.scalar(query.with_for_update() if lock else query)
    row = None if alias is None else await active_canary(session, alias.id)
    if alias is None or row is None:
        raise NotFound(f"no canary runs on alias {alias_name!r} of {adapter.name!r} (past "
                       "ones: its canaries list)", code="no_canary",
                       detail={"alias": alias_name})
    return await _with_versions(session, adapter, alias, row)


async def running_by_id(session: AsyncSession, canary_id: int, *,
                        lock: bool = True) -> Running | None:
    """The canary ``canary_id``, with its alias locked and read again under the lock
    unless ``lock`` is False; None if it no longer runs (the analysis' way in)."""
    alias_id = await session.scalar(select(CanaryRow.alias_id)
                                     .where(CanaryRow.id == canary_id))
    if alias_id is None:
        return None
    query = select(Alias).where(Alias.id == alias_id)
    alias = await session.scalar(query.with_for_update() if lock else query)
    row = await session.get(CanaryRow, canary_id, populate_existing=True)
    adapter = None if alias is None else await session.get(Adapter, alias.adapter_id)
    if alias is None or row is None or adapter is None or row.state not in ACTIVE_STATES:
        return None
    return await _with_versions(session, adapter, alias, row)


async def _with_versions(session: AsyncSession, adapter: Adapter, alias: Alias,
                         row: CanaryRow) -> Running:
    stable = await version_by_id(session, row.stable_version_id)
    canary = await version_by_id(session, row.canary_version_id)
    assert stable is not None and canary is not None  # foreign keys
    return Running(session, adapter, alias, row, stable, canary)


def _said(what: str, reason: str | None) -> str:
    return f"{what}: {reason}" if reason else what
