"""Writing events into the outbox (inside the caller's transaction) and reading them.

Producers build the typed events of ``loraplane.events``; the outbox stores their JSON,
so the wire contract is checked where an event is made as well as where it is read.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any, TypedDict

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.events import (
    AdapterCreated,
    AdapterNameFreed,
    AgentBindingReleased,
    Event,
    TokenIssued,
    TokenRevoked,
    parse_event,
    subject_for,
)
from registry_service.db.base import utcnow
from registry_service.db.engine import OUTBOX_FLAG
from registry_service.events.models import EventRow

# ``seq`` is drawn by the database when the outbox row is inserted, so an event built
# before that carries this placeholder; the stored payload leaves it out.
UNSEQUENCED = 0
# The row holds these; ``event_json`` merges them back into the payload.
_ROW_FIELDS = frozenset({"event_id", "seq"})


class Envelope(TypedDict):
    """The fields every event shares, as keyword arguments for an event model."""

    event_id: str
    seq: int
    time: datetime
    tenant: str
    adapter: str


def envelope(tenant: str, adapter: str) -> Envelope:
    """A fresh id and the current time for a new event about ``tenant``/``adapter``."""
    return Envelope(event_id=str(uuid.uuid4()), seq=UNSEQUENCED, time=utcnow(),
                    tenant=tenant, adapter=adapter)


def record_event(session: AsyncSession, event: Event, *, actor: str) -> EventRow:
    """Add ``event`` as an outbox row to the caller's transaction. Never commits."""
    row = EventRow(
        event_id=event.event_id, type=event.type, tenant=event.tenant, adapter=event.adapter,
        subject=subject_for(event.tenant, event.adapter), payload=_payload(event),
        actor=actor, created_at=event.time,
    )
    session.add(row)
    session.info.setdefault(OUTBOX_FLAG, []).append(row)
    return row


AuditOnly = (AdapterCreated | TokenIssued | TokenRevoked | AgentBindingReleased
             | AdapterNameFreed)


def record_audit(session: AsyncSession, event: AuditOnly, *, actor: str) -> EventRow:
    """Add ``event`` to the audit log only. Never commits.

    The row shares the outbox table (one ``seq`` order for ``GET /v1/events``) but is
    born published, with no subject and no stream sequence, so the relay never sends
    it: agents act on nothing here.
    """
    row = EventRow(
        event_id=event.event_id, type=event.type, tenant=event.tenant, adapter=event.adapter,
        subject="", payload=_payload(event), actor=actor, created_at=event.time,
        published_at=event.time,
    )
    session.add(row)
    return row


def _payload(event: Event | AuditOnly) -> dict[str, Any]:
    fields = event.model_dump(mode="json", exclude=set(_ROW_FIELDS | {"time"}))
    head = {key: fields.pop(key) for key in ("type", "tenant", "adapter")}
    # The keys keep the order they have always had on the wire, and the time its
    # ``+00:00`` form (pydantic would write ``Z``) so stored and new rows read alike.
    return {**head, "time": event.time.isoformat(), **fields}


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


async def events_mark(session: AsyncSession, tenant: str | None) -> tuple[int, int]:
    """(how many events, the highest seq) of ``tenant`` (None: all): a change detector.

    The count is there because on Postgres a transaction that commits late can add a
    row below the highest seq already seen; the count moves even then.
    """
    query = select(func.count(), func.coalesce(func.max(EventRow.seq), 0))
    if tenant is not None:
        query = query.where(EventRow.tenant == tenant)
    count, top = (await session.execute(query)).one()
    return int(count), int(top)


async def last_stream_seq(session: AsyncSession) -> int:
    value = await session.scalar(select(func.coalesce(func.max(EventRow.stream_seq), 0)))
    return int(value or 0)


__all__ = [
    "UNSEQUENCED",
    "Envelope",
    "envelope",
    "event_json",
    "event_of",
    "events_mark",
    "last_event_seq",
    "last_stream_seq",
    "list_events",
    "record_audit",
    "record_event",
]
