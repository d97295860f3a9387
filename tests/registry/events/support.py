"""Helpers for the event tests: writing outbox rows, reading them and the stream."""

from __future__ import annotations

from nats.js.api import RawStreamMsg
from nats.js.client import JetStreamContext
from sqlalchemy import select

from loraplane.events import STREAM_NAME, AdapterDeleted
from registry_service.db.engine import Database
from registry_service.events.models import EventRow
from registry_service.events.service import envelope, record_event
from registry_service.metrics import RegistryMetrics


async def record(db: Database, count: int = 1, *, tenant: str = "acme",
                 adapter: str = "bot", commit: bool = True) -> list[EventRow]:
    async with db.session() as session:
        rows = [
            record_event(session, AdapterDeleted(**envelope(tenant, adapter), base_model="tiny"),
                         actor="tests")
            for _ in range(count)
        ]
        await session.flush()
        if commit:
            await session.commit()
        else:
            await session.rollback()
    return rows


async def all_rows(db: Database) -> list[EventRow]:
    async with db.session() as session:
        return list(await session.scalars(select(EventRow).order_by(EventRow.seq)))


async def all_published(db: Database) -> bool:
    return all(row.published_at is not None for row in await all_rows(db))


async def stream_count(js: JetStreamContext) -> int:
    info = await js.stream_info(STREAM_NAME)
    return int(info.state.messages)


async def stream_messages(js: JetStreamContext) -> list[RawStreamMsg]:
    info = await js.stream_info(STREAM_NAME)
    first, last = info.state.first_seq, info.state.last_seq
    return [await js.get_msg(STREAM_NAME, seq) for seq in range(first, last + 1)]


def metric(relay_metrics: RegistryMetrics, name: str) -> float:
    return relay_metrics.registry.get_sample_value(name) or 0.0
