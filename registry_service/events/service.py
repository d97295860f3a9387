"""Writing events into the outbox (inside the caller's transaction) and reading them."""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.events import Event, parse_event, subject_for
from registry_service.db.base import utcnow
from registry_service.db.engine import OUTBOX_FLAG
from registry_service.events.models import EventRow


def record_event(
    session: AsyncSession, *, type: str, tenant: str, adapter: str, actor: str,
    body: dict[str, Any],
) -> EventRow:
    """Add an outbox row to the caller's transaction. Never commits.

    The payload leaves out ``event_id`` and ``seq``: the row holds them, and ``seq`` is
    only known at insert time; ``event_json`` merges them back.
    """
    now = utcnow()
    payload = {"type": type, "tenant": tenant, "adapter": adapter,
               "time": now.isoformat(), **body}
    row = EventRow(
        event_id=str(uuid.uuid4()), type=type, tenant=tenant, adapter=adapter,
        subject=subject_for(tenant, adapter), payload=payload, actor=actor, created_at=now,
    )
    session.add(row)
    session.info[OUTBOX_FLAG] = True
    return row


def event_json(row: EventRow) -> dict[str, Any]:
    return {**row.payload, "event_id": row.event_id, "seq": row.seq}


def event_of(row: EventRow) -> Event:
    return parse_event(json.dumps(event_json(row)))


async def list_events(
    session: AsyncSession, *, after: int, limit: int, tenant: str | None,
) -> list[EventRow]:
    query = select(EventRow).where(EventRow.seq > after).order_by(EventRow.seq).limit(limit)
    if tenant is not None:
        query = query.where(EventRow.tenant == tenant)
    return list(await session.scalars(query))


async def last_event_seq(session: AsyncSession) -> int:
    return int(await session.scalar(select(func.coalesce(func.max(EventRow.seq), 0))) or 0)


async def last_stream_seq(session: AsyncSession) -> int:
    value = await session.scalar(select(func.coalesce(func.max(EventRow.stream_seq), 0)))
    return int(value or 0)


__all__ = [
    "event_json",
    "event_of",
    "last_event_seq",
    "last_stream_seq",
    "list_events",
    "record_event",
]
