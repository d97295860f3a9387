"""Reading the event table as an audit log, one page at a time, scoped to the caller."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from registry_service.auth.roles import Principal, Role
from registry_service.events.schemas import EventPage
from registry_service.events.service import event_json, list_events


async def read_events(
    session: AsyncSession, principal: Principal, *, after: int, limit: int
) -> EventPage:
    """Events with ``seq > after`` in ``seq`` order; a tenant's token sees its own only.

    ``next_after`` is the last ``seq`` returned (or ``after`` when the page is empty),
    so a follower polls with it and never re-reads a row. On Postgres a sequence value
    is drawn at insert time, so a transaction that commits late can land behind a
    position already read; followers that must miss nothing use the JetStream stream.
    """
    principal.require(Role.READER)
    tenant = None if principal.is_global else principal.tenant
    rows = await list_events(session, after=after, limit=limit, tenant=tenant)
    return EventPage(events=[event_json(row) for row in rows],
                     next_after=rows[-1].seq if rows else after)
