"""The fleet: agents report what they serve; operators read the fleet and rollouts.

An agent's report replaces its previous one. Tenant-scoped readers see every agent
(hosts are shared) but only the entries about their own tenant's adapters.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import NoReturn

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.events import AgentStatus
from registry_service.adapters.models import Adapter
from registry_service.agents.fleet import record_fleet_change
from registry_service.agents.models import AgentRow
from registry_service.agents.reports import Seen, upsert_agent_status
from registry_service.agents.rollout import (
    AgentReport,
    AliasTarget,
    adapter_entries,
    alias_rollout,
    group_entries,
    placement,
    tier_entries,
)
from registry_service.agents.schemas import AgentList, AgentOut, RolloutOut
from registry_service.aliases.service import aliases_by_adapter
from registry_service.auth.models import ApiToken
from registry_service.auth.roles import Principal, Role
from registry_service.db.base import utcnow
from registry_service.errors import Forbidden, InvalidInput, NotFound

# Agents report every 30 s; three missed reports make an agent stale.
HEARTBEAT_INTERVAL_S = 30.0
DEFAULT_STALE_AFTER_S = 3 * HEARTBEAT_INTERVAL_S
MAX_STATUS_ENTRIES = 10_000


def _check_report(agent_id: str, status: AgentStatus) -> None:
    if status.agent_id != agent_id:
        raise InvalidInput("agent_id in the body does not match the path",
                           code="agent_id_mismatch",
                           detail={"path": agent_id, "body": status.agent_id[:300]})
    if not 0 < len(status.base_model) <= 255:
        raise InvalidInput("base_model must be 1-255 characters", code="invalid_base_model")
    entries = len(status.served) + len(status.failures) + len(status.loaded)
    if entries > MAX_STATUS_ENTRIES:
        raise InvalidInput(f"a status may list at most {MAX_STATUS_ENTRIES} entries",
                           code="status_too_large", detail={"entries": entries})


async def _bind_agent_token(session: AsyncSession, principal: Principal,
                            agent_id: str) -> None:
    """An agent token reports for one agent: the first id it reports as, if not made for one.

    Admins may report for any agent. The binding is in the caller's transaction, so a
    refused or failed report binds nothing.
    """
    if principal.role is not Role.AGENT or principal.agent_id == agent_id:
        return  # an admin, or a token bound to this agent already: nothing to write
    if principal.agent_id is not None:
        _refuse_binding(agent_id, principal.agent_id)
    # One conditional UPDATE: of two first reports racing, one binds and the other sees it.
    await session.execute(
        update(ApiToken).where(ApiToken.id == principal.token_id, ApiToken.agent_id.is_(None))
        .values(agent_id=agent_id))
    bound = await session.scalar(select(ApiToken.agent_id)
                                 .where(ApiToken.id == principal.token_id))
    if bound != agent_id:
        _refuse_binding(agent_id, bound)


def _refuse_binding(agent_id: str, bound: str | None) -> NoReturn:
    raise Forbidden(f"this agent token reports for agent {bound!r} only",
                    code="agent_id_forbidden",
                    detail={"agent_id": agent_id, "token_agent_id": bound})


FleetNote = Callable[[str, list[str]], None]


async def report_status(
    session: AsyncSession, principal: Principal, agent_id: str, status: AgentStatus, *,
    stale_after_s: float = DEFAULT_STALE_AFTER_S, fleet_note: FleetNote | None = None,
) -> AgentOut:
    """Store the report; a join or a leave of the live fleet records ``fleet_changed``
    in the same transaction, and ``fleet_note`` hears of it after the commit."""
    principal.require(Role.AGENT)
    _check_report(agent_id, status)
    await _bind_agent_token(session, principal, agent_id)
    seen, was_live, stored = await upsert_agent_status(session, status,
                                                       stale_after_s=stale_after_s)
    changed: list[str] | None = None
    if was_live == status.leaving:  # joined, or left
        changed = await live_agent_ids(session, status.base_model, stale_after_s=stale_after_s)
        record_fleet_change(session, status.base_model, changed,
                            joined=[] if status.leaving else [agent_id],
                            left=[agent_id] if status.leaving else [])
    await session.commit()
    if changed is not None and fleet_note is not None:
        fleet_note(status.base_model, changed)
    return _out(seen, stored, now=utcnow(), stale_after_s=stale_after_s)


def _out(row: AgentRow | Seen, status: AgentStatus, *, now: datetime,
         stale_after_s: float) -> AgentOut:
    age = max(0.0, (now - row.last_seen_at).total_seconds())
    return AgentOut(agent_id=row.agent_id, base_model=row.base_model,
                    first_seen_at=row.first_seen_at, last_seen_at=row.last_seen_at,
                    seconds_since_seen=age, stale=age > stale_after_s, status=status)


async def _visible_adapters(session: AsyncSession, principal: Principal) -> set[str] | None:
    """Names of the adapters whose entries the principal may see; None means all."""
    if principal.is_global:
        return None
    names = await session.scalars(
        select(Adapter.name).where(Adapter.tenant_id == principal.tenant_id))
    return set(names)


def _filtered(status: AgentStatus, visible: set[str] | None) -> AgentStatus:
    if visible is None:
        return status
    return status.model_copy(update={
        "served": [s for s in status.served if s.adapter in visible],
        "failures": [f for f in status.failures if f.adapter in visible],
        # vLLM names are ``adapter@version``.
        "loaded": [n for n in status.loaded if n.partition("@")[0] in visible],
    })


async def list_agents(
    session: AsyncSession, principal: Principal, *, stale_after_s: float = DEFAULT_STALE_AFTER_S,
    base_model: str | None = None,
) -> AgentList:
    principal.require(Role.READER)
    query = select(AgentRow).order_by(AgentRow.agent_id)
    if base_model is not None:
        query = query.where(AgentRow.base_model == base_model)
    rows = list(await session.scalars(query))
    visible = await _visible_adapters(session, principal)
    now = utcnow()
    agents = [
        _out(row, _filtered(AgentStatus.model_validate(row.status), visible), now=now,
             stale_after_s=stale_after_s)
        for row in rows
    ]
    return AgentList(stale_after_s=stale_after_s, agents=agents)


async def live_agent_ids(session: AsyncSession, base_model: str, *,
                         stale_after_s: float = DEFAULT_STALE_AFTER_S) -> list[str]:
    """The agents of ``base_model`` that reported within ``stale_after_s``: the fleet
    adapters are placed over (see ``loraplane.placement``)."""
    since = utcnow() - timedelta(seconds=stale_after_s)
    rows = await session.scalars(
        select(AgentRow.agent_id).where(AgentRow.base_model == base_model,
                                        AgentRow.last_seen_at >= since)
        .order_by(AgentRow.agent_id))
    return list(rows)


async def _rollout_adapter(session: AsyncSession, principal: Principal, name: str) -> Adapter:
    # A deleted adapter still has a rollout: the agents draining it.
    adapter = await session.scalar(select(Adapter).where(Adapter.name == name))
    if adapter is None or not principal.can_see(adapter.tenant_id):
        raise NotFound(f"adapter {name!r} not found", code="adapter_not_found",
                       detail={"adapter": name})
    return adapter


async def _alias_targets(session: AsyncSession,
                         adapters: list[Adapter]) -> dict[int, list[AliasTarget]]:
    """Every alias of each adapter, removed ones included, by adapter id; one query."""
    found = await aliases_by_adapter(session, [a.id for a in adapters])
    return {adapter_id: [AliasTarget(alias=alias.name, version=number,
                                     revision=alias.revision) for alias, number in pairs]
            for adapter_id, pairs in found.items()}


async def _reports(session: AsyncSession, stale_after_s: float) -> list[AgentReport]:
    now = utcnow()
    rows = await session.scalars(select(AgentRow).order_by(AgentRow.agent_id))
    return [
        AgentReport(agent_id=row.agent_id, base_model=row.base_model,
                    stale=(now - row.last_seen_at).total_seconds() > stale_after_s,
                    status=AgentStatus.model_validate(row.status))
        for row in rows
    ]


async def adapter_rollout(
    session: AsyncSession, principal: Principal, name: str, *,
    stale_after_s: float = DEFAULT_STALE_AFTER_S,
) -> RolloutOut:
    """For each alias of the adapter: who serves which version, who failed and why."""
    principal.require(Role.READER)
    adapter = await _rollout_adapter(session, principal, name)
    targets = await _alias_targets(session, [adapter])
    reports = await _reports(session, stale_after_s)
    return _rollout(adapter, targets[adapter.id], reports, stale_after_s)


async def tenant_rollouts(
    session: AsyncSession, principal: Principal, *,
    stale_after_s: float = DEFAULT_STALE_AFTER_S, limit: int = 1000,
) -> list[RolloutOut]:
    """The rollout of every live adapter the principal may see, by name (the fleet view),
    in three queries whatever the number of adapters."""
    principal.require(Role.READER)
    query = select(Adapter).where(Adapter.deleted_at.is_(None))
    if not principal.is_global:
        query = query.where(Adapter.tenant_id == principal.tenant_id)
    adapters = list(await session.scalars(query.order_by(Adapter.name).limit(limit)))
    targets = await _alias_targets(session, adapters)
    reports = await _reports(session, stale_after_s)
    return [_rollout(adapter, targets[adapter.id], reports, stale_after_s)
            for adapter in adapters]


def _rollout(adapter: Adapter, targets: list[AliasTarget], reports: list[AgentReport],
             stale_after_s: float) -> RolloutOut:
    by_alias, unaliased = group_entries(adapter_entries(reports, adapter.name), targets)
    fleet = [r for r in reports if r.base_model == adapter.base_model]
    aliases = [
        alias_rollout(t, by_alias[t.alias], fleet) for t in targets
        # A removed alias is shown only while some agent still reports it.
        if t.version is not None or by_alias[t.alias]
    ]
    tiers = tier_entries(fleet, adapter.name)
    placed, hot = placement(adapter.name, adapter.replicas, fleet, tiers)
    return RolloutOut(
        adapter=adapter.name, tenant=adapter.tenant.name, base_model=adapter.base_model,
        deleted=adapter.deleted_at is not None, stale_after_s=stale_after_s,
        agents=sum(1 for r in fleet if not r.stale), aliases=aliases, unaliased=unaliased,
        replicas=adapter.replicas, placed=placed, hot=hot, tiers=tiers,
    )
