"""The desired state of one base model: what every agent serving it should load.

An agent reconciles against this snapshot at start-up and periodically, and
subscribes to the stream from ``stream_seq + 1`` for the changes after it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, select
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.events import DesiredAdapter, DesiredAlias, DesiredState
from registry_service.adapters.models import Adapter
from registry_service.agents.service import DEFAULT_STALE_AFTER_S, live_agent_ids
from registry_service.aliases.service import alias_targets
from registry_service.auth.roles import Principal, Role
from registry_service.canaries.state import active_routes
from registry_service.events.service import last_event_seq, last_stream_seq
from registry_service.routing.service import route_revisions, rules_to
from registry_service.versions.refs import version_ref


def _adapter_filter(
    principal: Principal, base_model: str, adapter: str | None
) -> list[ColumnElement[bool]]:
    where = [Adapter.base_model == base_model, Adapter.deleted_at.is_(None)]
    if adapter is not None:
        where.append(Adapter.name == adapter)
    if not principal.is_global:
        where.append(Adapter.tenant_id == principal.tenant_id)
    return where


async def _adapters(session: AsyncSession, where: Sequence[ColumnElement[bool]]) -> list[Adapter]:
    return list(await session.scalars(select(Adapter).where(*where).order_by(Adapter.name)))


async def _consistent_reads(session: AsyncSession) -> None:
    # On Postgres every statement below then reads the one snapshot taken at the
    # first, so an adapter and its aliases come from the same moment. The level can
    # only be chosen before a transaction starts; a caller already inside one reads
    # at its own level, which the read order below keeps correct anyway.
    if session.get_bind().dialect.name == "postgresql" and not session.in_transaction():
        await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})


async def desired_state(
    session: AsyncSession, principal: Principal, *, base_model: str, adapter: str | None = None,
    stale_after_s: float = DEFAULT_STALE_AFTER_S,
) -> DesiredState:
    """Every live adapter of ``base_model`` with its aliases that point at a version,
    and the routing rules to those adapters. Tenant tokens see their tenant only.

    With ``adapter``, only that adapter (and the rules to it): what an agent re-reads
    when it reconciles one key. A deleted or unknown adapter gives an empty list."""
    principal.require(Role.READER)
    await _consistent_reads(session)
    # The stream position is read BEFORE the snapshot, and that order is what makes
    # ``stream_seq`` safe to resume from. An event missing from the snapshot belongs to
    # a transaction that committed after this read; the relay publishes a row only
    # after its transaction committed, so that event is published after this read
    # and JetStream gives it a higher sequence than any recorded so far. Read after
    # the snapshot instead, a change committed in between would be neither in the
    # snapshot nor above ``stream_seq``, and the agent would never hear of it.
    stream_seq = await last_stream_seq(session)
    event_seq = await last_event_seq(session)
    # Before the rules, for the same reason: a rule change missing from them has a
    # revision above this one, so the agent applies (or re-reads) it.
    revisions = (await route_revisions(session, principal.tenant_id if not
                                       principal.is_global else None)
                 if adapter is None else None)
    where = _adapter_filter(principal, base_model, adapter)
    adapters = await _adapters(session, where)
    aliases: dict[int, list[DesiredAlias]] = {adapter.id: [] for adapter in adapters}
    by_id = {adapter.id: adapter for adapter in adapters}
    canaries = await active_routes(session, where)
    for alias, version in await alias_targets(session, where):
        # Both reads share one snapshot, but the filter keeps a dangling alias (should
        # a read ever see a newer moment) out rather than failing the whole snapshot.
        if alias.adapter_id in by_id:
            owner = by_id[alias.adapter_id]
            aliases[alias.adapter_id].append(DesiredAlias(
                alias=alias.name, revision=alias.revision, target=version_ref(owner, version),
                canary=canaries.get(alias.id)))
    return DesiredState(
        base_model=base_model, stream_seq=stream_seq, event_seq=event_seq,
        adapters=[DesiredAdapter(tenant=a.tenant.name, name=a.name, base_model=a.base_model,
                                 aliases=aliases[a.id], replicas=a.replicas)
                  for a in adapters],
        routes=await rules_to(session, where),
        agents=await live_agent_ids(session, base_model, stale_after_s=stale_after_s),
        route_revisions=revisions,
    )
