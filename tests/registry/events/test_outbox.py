"""The outbox stores a typed event's JSON, and reads it back as the same event."""

from __future__ import annotations

from loraplane.events import (
    AdapterDeleted,
    FileRef,
    RouteChanged,
    RouteRule,
    VersionPublished,
    VersionRef,
)
from registry_service.db.engine import Database
from registry_service.events.service import envelope, event_json, event_of, record_event


def _events() -> list[AdapterDeleted | VersionPublished | RouteChanged]:
    ref = VersionRef(adapter="bot", version=3, digest="d" * 64, base_model="tiny", rank=8,
                     alpha=16.0, target_modules=["q_proj"],
                     files=[FileRef(name="adapter_config.json", size=10, sha256="a" * 64,
                                    url="/v1/adapters/bot/versions/3/files/x")])
    rule = RouteRule(kind="task", key="t", adapter="bot", alias="live", tenant="acme",
                     base_model="tiny")
    return [AdapterDeleted(**envelope("acme", "bot"), base_model="tiny"),
            VersionPublished(**envelope("acme", "bot"), base_model="tiny", target=ref),
            RouteChanged(**envelope("acme", "bot"), kind="task", key="t", rule=rule)]


async def test_a_recorded_event_reads_back_as_the_model_it_was_built_from(db: Database) -> None:
    events = _events()
    async with db.session() as session:
        rows = [record_event(session, event, actor="tests") for event in events]
        await session.commit()
    for event, row in zip(events, rows, strict=True):
        assert row.event_id == event.event_id and row.type == event.type
        assert event_of(row) == event.model_copy(update={"seq": row.seq})
        # The wire keeps the field order and the time format it always had.
        wire = event_json(row)
        assert list(wire)[:4] == ["type", "tenant", "adapter", "time"]
        assert wire["time"] == event.time.isoformat() and wire["time"].endswith("+00:00")
