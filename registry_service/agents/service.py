"""The fleet: agents report what they serve; operators read the fleet and rollouts.

An agent's report replaces its previous one (ingest.py stores it). Tenant-scoped
readers see every agent (hosts are shared) but only the entries about their own
tenant's adapters.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.events import AgentStatus
from registry_service.adapters.models import Adapter
from registry_service.agents.models import AgentRow
from registry_service.agents.reports import Seen
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
from registry_service.auth.roles import Principal, Role
from registry_service.db.base import utcnow
from registry_service.errors import NotFound

# Agents report every 30 s; three missed reports make an agent stale.
HEARTBEAT_INTERVAL_S = 30.0
DEFAULT_STALE_AFTER_S = 3 * HEARTBEAT_INTERVAL_S


def agent_out(row: AgentRow | Seen, status: AgentStatus, *, now: datetime,
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
        "tiers": [t for t in status.tiers if t.adapter in visible],
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
        agent_out(row, _filtered(AgentStatus.model_validate(row.status), visible), now=now,
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


async def rollouts_by_scope(
    session: AsyncSession, tenant_ids: set[int | None], *,
    stale_after_s: float = DEFAULT_STALE_AFTER_S, limit: int = 1000,
) -> dict[int | None, list[RolloutOut]]:
    """``tenant_rollouts`` for many scopes (a tenant's id, or None for every tenant) from
    one read of the fleet: the UI's live streams share it, whatever their number."""
    query = select(Adapter).where(Adapter.deleted_at.is_(None))
    if None not in tenant_ids:
        query = query.where(Adapter.tenant_id.in_(sorted(t for t in tenant_ids if t)))
    adapters = list(await session.scalars(query.order_by(Adapter.name)))
    targets = await _alias_targets(session, adapters)
    reports = await _reports(session, stale_after_s)
    built: dict[int, RolloutOut] = {}

    def rollout(adapter: Adapter) -> RolloutOut:
        if adapter.id not in built:
            built[adapter.id] = _rollout(adapter, targets[adapter.id], reports, stale_after_s)
        return built[adapter.id]

    return {scope: [rollout(a) for a in adapters
                    if scope is None or a.tenant_id == scope][:limit]
            for scope in tenant_ids}


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
