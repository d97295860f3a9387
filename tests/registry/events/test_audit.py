"""The audit log, read through its service function."""

from __future__ import annotations

from registry_service.db.engine import Database
from registry_service.events.audit import read_events
from registry_service.events.service import event_json
from tests.registry.seed import ADMIN, AGENT, publish_two_of_three, seed_catalog


async def test_audit_log_pages_in_seq_order_and_is_tenant_scoped(db: Database) -> None:
    catalog = await seed_catalog(db)
    rows = await publish_two_of_three(db)

    async with db.session() as session:
        first = await read_events(session, ADMIN, after=0, limit=2)
        second = await read_events(session, AGENT, after=first.next_after, limit=2)
        acme = await read_events(session, catalog.acme_reader, after=0, limit=100)
        done = await read_events(session, ADMIN, after=rows[-1].seq, limit=100)

    assert first.events == [event_json(row) for row in rows[:2]]
    assert first.next_after == rows[1].seq
    assert second.events == [event_json(rows[2])]
    assert second.next_after == rows[2].seq
    assert acme.events == [event_json(rows[0]), event_json(rows[2])]
    assert (done.events, done.next_after) == ([], rows[-1].seq)
