"""The fleet: agents report what they serve; operators read the fleet and rollouts.

An agent's report replaces its previous one (ingest.py stores it). Tenant-scoped
readers see every agent (hosts are shared) but only the entries about their own
tenant's adapters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.events import AgentStatus
from registry_service.adapters.models import Adapter
from registry_service.agents.models import AgentRow
from registry_service.agents.report_read import (
    StoredReport,
    gc_paused,
    parse_reports,
    parse_status,
    stored_reports,
)
from registry_service.agents.reports import Seen
from registry_service.agents.rollout import (
    AgentReport,
    AliasTarget,
    ReportIndex,
    alias_rollout,
    group_entries,
    index_reports,
    placement,
)
from registry_service.agents.schemas import AgentList, AgentOut, RolloutOut
from registry_service.aliases.models import Alias
from registry_service.auth.roles import Principal, Role
from registry_service.db.base import utcnow
from registry_service.errors import NotFound
from registry_service.tenants.models import Tenant
from registry_service.versions.models import Version

T = TypeVar("T")
# Agents report every 30 s; three missed reports make an agent stale.
HEARTBEAT_INTERVAL_S = 30.0
DEFAULT_STALE_AFTER_S = 3 * HEARTBEAT_INTERVAL_S


def agent_out(row: AgentRow | Seen | StoredReport, status: AgentStatus, *, now: datetime,
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


async def list_agents_json(
    session: AsyncSession, principal: Principal, *, stale_after_s: float = DEFAULT_STALE_AFTER_S,
    base_model: str | None = None,
) -> str:
    """``list_agents`` as its JSON, written on the worker thread too: a hundred agents'
    reports are megabytes of it, which the route's own serializer wrote on the loop."""
    principal.require(Role.READER)
    rows = await stored_reports(session, base_model)
    visible = await _visible_adapters(session, principal)
    return await asyncio.to_thread(_agents_json, rows, visible, utcnow(), stale_after_s)


def _agents_json(rows: list[StoredReport], visible: set[str] | None, now: datetime,
                 stale_after_s: float) -> str:
    # An agent at a time, so that no one call holds the GIL long.
    with gc_paused():
        agents = ",".join(agent.model_dump_json()
                          for agent in _agents_out(rows, visible, now, stale_after_s))
    empty = AgentList(stale_after_s=stale_after_s, agents=[]).model_dump_json()
    return f"{empty.removesuffix('[]}')}[{agents}]}}"


def _agents_out(rows: list[StoredReport], visible: set[str] | None, now: datetime,
                stale_after_s: float) -> list[AgentOut]:
    """CPU only (every report parsed): run on a worker thread."""
    return [agent_out(row, _filtered(parse_status(row), visible), now=now,
                      stale_after_s=stale_after_s) for row in rows]


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


async def _rollout_adapter(session: AsyncSession, principal: Principal,
                           name: str) -> _AdapterView:
    # A deleted adapter still has a rollout: the agents draining it.
    found = await _adapter_views(session, select(*_VIEW_COLUMNS).where(Adapter.name == name))
    if not found or not principal.can_see(found[0].tenant_id):
        raise NotFound(f"adapter {name!r} not found", code="adapter_not_found",
                       detail={"adapter": name})
    return found[0]


@dataclass(frozen=True, slots=True)
class _AdapterView:
    """What a rollout needs of an adapter, as plain values for the worker thread."""
    id: int
    name: str
    tenant_id: int
    tenant: str
    base_model: str
    deleted: bool
    replicas: int | None


@dataclass(frozen=True, slots=True)
class _FleetRead:
    """What the rollouts are built from, read on the loop in three queries."""
    adapters: list[_AdapterView]
    targets: dict[int, list[AliasTarget]]
    reports: list[StoredReport]
    now: datetime
    stale_after_s: float


_ViewQuery = Select[int, str, int, str, str, bool, int | None]
_VIEW_COLUMNS = (Adapter.id, Adapter.name, Adapter.tenant_id, Tenant.name, Adapter.base_model,
                 Adapter.deleted_at.is_not(None), Adapter.replicas)


async def _adapter_views(session: AsyncSession, query: _ViewQuery) -> list[_AdapterView]:
    """``query``'s adapters as plain rows: a thousand ORM objects, and their aliases',
    held the loop for about 30 ms."""
    rows = await session.execute(query.join(Tenant, Tenant.id == Adapter.tenant_id))
    return [_AdapterView(*row) for row in rows]


async def _alias_targets(session: AsyncSession,
                         adapter_ids: list[int]) -> dict[int, list[AliasTarget]]:
    """Every alias of each adapter, removed ones included, by name; one query."""
    found: dict[int, list[AliasTarget]] = {i: [] for i in adapter_ids}
    if not adapter_ids:
        return found
    rows = await session.execute(
        select(Alias.adapter_id, Alias.name, Version.number, Alias.revision)
        .outerjoin(Version, Version.id == Alias.version_id)
        .where(Alias.adapter_id.in_(adapter_ids)).order_by(Alias.adapter_id, Alias.name))
    for adapter_id, name, number, revision in rows:
        found[adapter_id].append(AliasTarget(alias=name, version=number, revision=revision))
    return found


async def _read_fleet(session: AsyncSession, adapters: list[_AdapterView],
                      stale_after_s: float) -> _FleetRead:
    targets = await _alias_targets(session, [a.id for a in adapters])
    return _FleetRead(adapters, targets, await stored_reports(session), utcnow(),
                      stale_after_s)


def _build_rollouts(read: _FleetRead) -> dict[int, RolloutOut]:
    reports = parse_reports(read.reports, read.now, read.stale_after_s)
    index = index_reports(reports)
    fleets: dict[str, list[AgentReport]] = {}
    for report in reports:
        fleets.setdefault(report.base_model, []).append(report)
    return {a.id: _rollout(a, read.targets[a.id], index, fleets.get(a.base_model, []),
                           read.stale_after_s)
            for a in read.adapters}


async def adapter_rollout(
    session: AsyncSession, principal: Principal, name: str, *,
    stale_after_s: float = DEFAULT_STALE_AFTER_S,
) -> RolloutOut:
    """For each alias of the adapter: who serves which version, who failed and why."""
    principal.require(Role.READER)
    adapter = await _rollout_adapter(session, principal, name)
    read = await _read_fleet(session, [adapter], stale_after_s)
    # Built on a worker thread: every agent's report is read for it.
    return await asyncio.to_thread(_rendered, read, _only, 1)


async def tenant_rollouts(
    session: AsyncSession, principal: Principal, render: Callable[[list[RolloutOut]], T], *,
    stale_after_s: float = DEFAULT_STALE_AFTER_S, limit: int = 1000,
) -> T:
    """The rollout of every live adapter the principal may see, by name (the fleet view),
    in three queries whatever the number of adapters, given to ``render`` on the worker
    thread that built them (where they are let go of too)."""
    principal.require(Role.READER)
    query = select(*_VIEW_COLUMNS).where(Adapter.deleted_at.is_(None))
    if not principal.is_global:
        query = query.where(Adapter.tenant_id == principal.tenant_id)
    adapters = await _adapter_views(session, query.order_by(Adapter.name).limit(limit))
    read = await _read_fleet(session, adapters, stale_after_s)
    return await asyncio.to_thread(_rendered, read, render, limit)


async def rollouts_by_scope(
    session: AsyncSession, tenant_ids: set[int | None],
    render: Callable[[list[RolloutOut]], T], *,
    stale_after_s: float = DEFAULT_STALE_AFTER_S, limit: int = 1000,
) -> dict[int | None, T]:
    """``tenant_rollouts`` for many scopes (a tenant's id, or None for every tenant) from
    one read of the fleet: the UI's live streams share it, whatever their number. Each
    scope's rollouts are given to ``render`` on the worker thread that built them."""
    query = select(*_VIEW_COLUMNS).where(Adapter.deleted_at.is_(None))
    if None not in tenant_ids:
        query = query.where(Adapter.tenant_id.in_(sorted(t for t in tenant_ids if t)))
    adapters = await _adapter_views(session, query.order_by(Adapter.name))
    read = await _read_fleet(session, adapters, stale_after_s)
    return await asyncio.to_thread(_rendered_scopes, read, tenant_ids, render, limit)


def _only(rollouts: list[RolloutOut]) -> RolloutOut:
    return rollouts[0]


def _rendered(read: _FleetRead, render: Callable[[list[RolloutOut]], T], limit: int) -> T:
    # The models are let go of inside the pause: each helper's frame ends within it.
    with gc_paused():
        return _render_all(read, render, limit)


def _render_all(read: _FleetRead, render: Callable[[list[RolloutOut]], T], limit: int) -> T:
    built = _build_rollouts(read)
    return render([built[a.id] for a in read.adapters][:limit])


def _rendered_scopes(read: _FleetRead, tenant_ids: set[int | None],
                     render: Callable[[list[RolloutOut]], T], limit: int) -> dict[int | None, T]:
    with gc_paused():
        return _render_scopes(read, tenant_ids, render, limit)


def _render_scopes(read: _FleetRead, tenant_ids: set[int | None],
                   render: Callable[[list[RolloutOut]], T], limit: int) -> dict[int | None, T]:
    built = _build_rollouts(read)
    return {scope: render([built[a.id] for a in read.adapters
                           if scope is None or a.tenant_id == scope][:limit])
            for scope in tenant_ids}


def _rollout(adapter: _AdapterView, targets: list[AliasTarget], index: ReportIndex,
             fleet: list[AgentReport], stale_after_s: float) -> RolloutOut:
    by_alias, unaliased = group_entries(index.entries_of(adapter.name), targets)
    aliases = [
        alias_rollout(t, by_alias[t.alias], fleet) for t in targets
        # A removed alias is shown only while some agent still reports it.
        if t.version is not None or by_alias[t.alias]
    ]
    tiers = index.tiers_of(fleet, adapter.name)
    placed, hot = placement(adapter.name, adapter.replicas, fleet, tiers)
    return RolloutOut(
        adapter=adapter.name, tenant=adapter.tenant, base_model=adapter.base_model,
        deleted=adapter.deleted, stale_after_s=stale_after_s,
        agents=sum(1 for r in fleet if not r.stale), aliases=aliases, unaliased=unaliased,
        replicas=adapter.replicas, placed=placed, hot=hot, tiers=tiers,
    )
