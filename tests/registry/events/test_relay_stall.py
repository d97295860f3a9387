"""A stalled NATS (connected, never answering) must not stall the registry.

The relay used to publish inside the transaction that selected its rows. On SQLite that
transaction is the database's one write lock (every transaction begins IMMEDIATE), so
while JetStream's ack was late every request, reads included, waited behind it and
writers failed with "database is locked". The relay now claims rows in one short
transaction and publishes with none open.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from nats.js.client import JetStreamContext
from sqlalchemy import select, update

from devharness.registry import RegistryHarness, registry_settings, running_registry
from devharness.services import NatsService
from devharness.tcp_pause import PausableTcpProxy
from devharness.waiting import eventually
from registry_service.db.base import utcnow
from registry_service.db.engine import Database
from registry_service.events.bus import MSG_ID_HEADER
from registry_service.events.models import EventRow
from tests.registry.events.conftest import RelayFactory
from tests.registry.events.support import all_published, all_rows, record, stream_messages

STALLED = "stalled-bot"


@pytest.fixture
def stalling_proxy(nats: NatsService) -> Iterator[PausableTcpProxy]:
    """NATS behind a proxy that, while held, answers nothing on a connection that has
    published an event of ``STALLED``: the publish waits for an ack that does not come."""
    with PausableTcpProxy(nats.url, marker=STALLED.encode(), first_event=b"") as proxy:
        yield proxy


def nats_url(proxy: PausableTcpProxy) -> str:
    return proxy.url.replace("http://", "nats://")


@pytest.fixture
async def stalled_registry(tmp_path: Path, nats: NatsService,
                           stalling_proxy: PausableTcpProxy) -> AsyncIterator[RegistryHarness]:
    settings = registry_settings("embedded", tmp_path / "data", nats_url(stalling_proxy),
                                 None, None)
    # A publish waits far longer than any request may take: a request that completes
    # while the relay is stuck completed because nothing waited for the relay.
    settings = settings.model_copy(update={"relay_publish_timeout_s": 600.0,
                                           "relay_claim_lease_s": 1800.0})
    async with running_registry(settings, "embedded", nats, None) as harness:
        yield harness


async def event_ids(js: JetStreamContext) -> list[str]:
    return [m.headers[MSG_ID_HEADER] for m in await stream_messages(js) if m.headers]


async def test_writes_and_reads_complete_while_the_relay_waits_on_a_stalled_nats(
    stalled_registry: RegistryHarness, stalling_proxy: PausableTcpProxy,
    js: JetStreamContext,
) -> None:
    registry = stalled_registry
    relay = registry.ctx.relay
    await eventually(lambda: relay.connected, what="relay connected through the proxy")
    await registry.create_adapter(STALLED)
    await eventually(lambda: all_published(registry.ctx.db), what="the create published")

    with stalling_proxy.holding():
        deleted = await registry.client.delete(f"/v1/adapters/{STALLED}",
                                               headers=registry.admin_headers)
        assert deleted.status_code == 204, deleted.text
        # The relay has sent the event and waits for its ack.
        await eventually(lambda: stalling_proxy.held_connections >= 1, what="publish sent")

        created = await registry.client.post(
            "/v1/adapters", json={"name": "other-bot", "base_model": "tiny-llama",
                                  "tenant": "acme"}, headers=registry.admin_headers)
        listed = await registry.client.get("/v1/adapters", headers=registry.admin_headers)

        assert created.status_code == 201, created.text
        assert listed.status_code == 200, listed.text
        assert "other-bot" in [a["name"] for a in listed.json()["adapters"]]
        # Both answered while the publish still waits on NATS (the commit handed its
        # row over; the hand-over holds it): the row is not published yet.
        assert stalling_proxy.held_connections >= 1
        assert STALLED not in {e.adapter for e in await all_rows(registry.ctx.db)
                               if e.published_at is not None and e.type == "adapter_deleted"}

    await eventually(lambda: all_published(registry.ctx.db), what="events published")
    rows = await all_rows(registry.ctx.db)
    ids = await event_ids(js)
    outbox = [row for row in rows if row.subject]  # audit-only rows are never sent
    assert [row.type for row in outbox] == ["adapter_deleted"]
    assert ids == [outbox[0].event_id]  # exactly once
    assert all(row.claimed_by is None and row.claimed_until is None for row in rows)


async def test_rows_claimed_by_a_live_relay_wait_and_a_dead_relays_claim_expires(
    db: Database, nats: NatsService, relays: RelayFactory, js: JetStreamContext,
) -> None:
    rows = await record(db, 2, adapter="claimed")
    # Another relay leased these rows and is (as far as anyone knows) publishing them.
    async with db.session() as session:
        await session.execute(update(EventRow).values(
            claimed_by="other-relay", claimed_until=utcnow() + timedelta(hours=1)))
        await session.commit()
    relay = await relays(db, nats.url, relay_poll_interval_s=0.05)
    [free] = await record(db, 1, adapter="free")
    await eventually(lambda: free_published(db, free.seq), what="the unclaimed row")
    assert not [row for row in await all_rows(db)
                if row.adapter == "claimed" and row.published_at is not None]

    # That relay died: its lease runs out, and this one publishes the rows, in order.
    async with db.session() as session:
        await session.execute(update(EventRow).where(EventRow.adapter == "claimed")
                              .values(claimed_until=utcnow() - timedelta(seconds=1)))
        await session.commit()
    await eventually(lambda: all_published(db), what="the expired claim taken over")
    published = await all_rows(db)
    claimed = [row for row in published if row.adapter == "claimed"]
    assert [row.event_id for row in claimed] == [row.event_id for row in rows]
    assert claimed[0].stream_seq is not None and claimed[1].stream_seq is not None
    assert claimed[0].stream_seq < claimed[1].stream_seq
    assert sorted(await event_ids(js)) == sorted(row.event_id for row in published)
    assert relay.connected


async def free_published(db: Database, seq: int) -> bool:
    async with db.session() as session:
        row = await session.scalar(select(EventRow).where(EventRow.seq == seq))
        return row is not None and row.published_at is not None


async def test_a_relay_stopped_while_stuck_hands_its_rows_back(
    db: Database, nats: NatsService, stalling_proxy: PausableTcpProxy, relays: RelayFactory,
    js: JetStreamContext,
) -> None:
    stuck = await relays(db, nats_url(stalling_proxy), relay_poll_interval_s=0.05,
                         relay_publish_timeout_s=600.0, relay_claim_lease_s=1800.0)
    await eventually(lambda: stuck.connected, what="relay connected through the proxy")
    with stalling_proxy.holding():
        [row] = await record(db, 1, adapter=STALLED)
        await eventually(lambda: stalling_proxy.held_connections >= 1, what="publish sent")
        await stuck.stop(grace_s=0.01)
        [claimed] = await all_rows(db)
        assert claimed.published_at is None
        assert (claimed.claimed_by, claimed.claimed_until) == (None, None)

    # Not a lease's length later: the next relay publishes the row now, and the copy the
    # stuck relay had sent is dropped by the stream.
    await relays(db, nats.url, relay_poll_interval_s=0.05)
    await eventually(lambda: all_published(db), what="the row published by the next relay")
    assert await event_ids(js) == [row.event_id]
