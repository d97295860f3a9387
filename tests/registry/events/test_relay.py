"""The outbox relay against a real nats-server and real SQLite / Postgres databases."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from nats.js.client import JetStreamContext
from sqlalchemy import update

from devharness.services import NatsService
from devharness.waiting import eventually
from loraplane.event_signing import SIGNATURE_HEADER, EventKeys
from loraplane.events import parse_event
from registry_service.db.engine import Database
from registry_service.events.bus import MSG_ID_HEADER
from registry_service.events.models import EventRow
from registry_service.events.relay import EventRelay
from registry_service.events.service import event_json
from registry_service.metrics import RegistryMetrics
from tests.registry.events.conftest import RelayFactory
from tests.registry.events.support import (
    all_published,
    all_rows,
    metric,
    record,
    stream_count,
    stream_messages,
)

PUBLISHED = "loraplane_registry_events_published_total"
PENDING = "loraplane_registry_outbox_pending"
ERRORS = "loraplane_registry_relay_errors_total"


async def passes_after_now(relay: EventRelay) -> None:
    """Wait until a whole relay pass has begun and ended since this call."""
    seen = relay.passes
    await eventually(lambda: relay.passes >= seen + 2, what="a whole relay pass")


async def test_committed_rows_are_published_with_id_subject_and_payload(
    db: Database, nats: NatsService, relays: RelayFactory, js: JetStreamContext,
) -> None:
    metrics = RegistryMetrics()
    # A poll interval far beyond the deadline: only notify() can deliver this fast.
    relay = await relays(db, nats.url, metrics=metrics, relay_poll_interval_s=60)
    await eventually(lambda: relay.connected, what="relay connected")
    # The first (empty) pass is over: the relay is idle for 60 s unless notified.
    await eventually(lambda: relay.passes >= 1, what="first pass")
    await record(db, 3, tenant="acme", adapter="support-bot")

    await eventually(lambda: all_published(db), timeout_s=5, what="rows published")
    rows = await all_rows(db)
    messages = await stream_messages(js)
    assert len(rows) == len(messages) == 3
    for row, msg in zip(rows, messages, strict=True):
        assert msg.subject == "loraplane.events.acme.support-bot" == row.subject
        assert msg.headers is not None and msg.headers[MSG_ID_HEADER] == row.event_id
        assert msg.data is not None and json.loads(msg.data) == event_json(row)
        # Signed by the relay's key, over the bytes as published.
        keys = EventKeys({relay.signer.key_id: relay.signer.public})
        assert keys.verify(msg.data, msg.headers[SIGNATURE_HEADER]).ok
        assert row.stream_seq == msg.seq
        event = parse_event(msg.data)
        assert (event.event_id, event.seq, event.type) == (row.event_id, row.seq,
                                                           "adapter_deleted")
    assert metric(metrics, PUBLISHED) == 3
    assert metric(metrics, PENDING) == 0
    assert metric(metrics, ERRORS) == 0


async def test_rolled_back_transaction_publishes_nothing(
    db: Database, nats: NatsService, relays: RelayFactory, js: JetStreamContext,
) -> None:
    relay = await relays(db, nats.url, relay_poll_interval_s=0.05)
    await record(db, 2, adapter="rolled-back", commit=False)
    [marker] = await record(db, 1, adapter="committed")

    await eventually(lambda: all_published(db), what="marker published")
    await passes_after_now(relay)  # a whole pass since: nothing else may appear
    [msg] = await stream_messages(js)
    assert msg.headers is not None and msg.headers[MSG_ID_HEADER] == marker.event_id
    assert [row.adapter for row in await all_rows(db)] == ["committed"]


async def test_rows_wait_out_a_nats_outage_and_are_published_after_it(
    db: Database, nats: NatsService, relays: RelayFactory, js: JetStreamContext,
) -> None:
    metrics = RegistryMetrics()
    relay = await relays(db, nats.url, metrics=metrics, relay_poll_interval_s=0.05)
    await record(db, 1, adapter="before")
    await eventually(lambda: all_published(db), what="first row published")

    await nats.stop_async()
    await record(db, 4, adapter="during")
    # Two failed passes: the rows stay queued through the retries, not just the first.
    await eventually(lambda: metric(metrics, ERRORS) >= 2, what="failed attempts")
    assert not relay.connected
    pending = [row for row in await all_rows(db) if row.published_at is None]
    assert [row.adapter for row in pending] == ["during"] * 4
    assert all(row.stream_seq is None for row in pending)
    assert metric(metrics, PENDING) == 4

    await nats.start_async()  # same port, same store: the stream survives
    await eventually(lambda: all_published(db), what="rows published after the outage")
    assert await stream_count(js) == 5
    assert sorted(row.stream_seq or 0 for row in await all_rows(db)) == [1, 2, 3, 4, 5]
    assert metric(metrics, PENDING) == 0
    assert relay.connected


async def test_relay_starts_while_nats_is_down(
    db: Database, nats: NatsService, relays: RelayFactory,
) -> None:
    # The registry keeps accepting writes with NATS down: start() must not fail or wait.
    await nats.stop_async()
    metrics = RegistryMetrics()
    relay = await asyncio.wait_for(relays(db, nats.url, metrics=metrics,
                                          relay_poll_interval_s=0.05), 1)
    await record(db, 2)
    await passes_after_now(relay)  # it tried since the rows were committed, and failed
    assert metric(metrics, ERRORS) >= 2
    assert not relay.connected
    assert not await all_published(db)
    await nats.start_async()
    await eventually(lambda: all_published(db), what="rows published once NATS is up")
    assert relay.connected


async def test_republished_row_is_deduplicated_by_the_stream(
    db: Database, nats: NatsService, relays: RelayFactory, js: JetStreamContext,
) -> None:
    metrics = RegistryMetrics()
    relay = await relays(db, nats.url, metrics=metrics, relay_poll_interval_s=0.05)
    [row] = await record(db, 1)
    await eventually(lambda: all_published(db), what="row published")
    [first] = await all_rows(db)

    # What a relay that crashed between the ack and its commit leaves behind.
    async with db.session() as session:
        await session.execute(update(EventRow).where(EventRow.seq == row.seq)
                              .values(published_at=None, stream_seq=None))
        await session.commit()
    relay.notify()
    await eventually(lambda: metric(metrics, PUBLISHED) == 2, what="second publish")

    [again] = await all_rows(db)
    assert again.published_at is not None
    assert again.stream_seq == first.stream_seq
    assert await stream_count(js) == 1


async def test_two_relays_publish_each_row_exactly_once(
    databases: Callable[[], Database], nats: NatsService, relays: RelayFactory,
    js: JetStreamContext,
) -> None:
    # Two replicas, each with its own engine, draining one outbox in small batches.
    writer, replica_a, replica_b = databases(), databases(), databases()
    metrics_a, metrics_b = RegistryMetrics(), RegistryMetrics()
    await relays(replica_a, nats.url, metrics=metrics_a, relay_poll_interval_s=0.01,
                 relay_batch_size=3)
    await relays(replica_b, nats.url, metrics=metrics_b, relay_poll_interval_s=0.01,
                 relay_batch_size=3)
    for _ in range(20):
        await record(writer, 6)

    await eventually(lambda: all_published(writer), timeout_s=60, what="all rows published")
    # The stream would hide a double publish (same Nats-Msg-Id), so count the relays' own
    # committed publishes: a row claimed by both replicas would be counted twice.
    published = metric(metrics_a, PUBLISHED) + metric(metrics_b, PUBLISHED)
    assert published == 120
    assert await stream_count(js) == 120
    ids = {msg.headers[MSG_ID_HEADER] for msg in await stream_messages(js) if msg.headers}
    assert ids == {row.event_id for row in await all_rows(writer)}


async def test_stop_finishes_and_leaves_no_task(
    db: Database, nats: NatsService, relays: RelayFactory,
) -> None:
    relay = await relays(db, nats.url, relay_poll_interval_s=0.05)
    await eventually(lambda: relay.connected, what="relay connected")
    await asyncio.wait_for(relay.stop(grace_s=2), 3)
    assert not relay.connected
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "event-relay"]
    # After stop, commits no longer wake anything and nothing is published.
    passes = relay.passes
    relay.notify()
    await record(db, 1)
    # Nothing is left that could publish: notify() and the commit woke no new task.
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "event-relay"]
    assert relay.passes == passes
    assert not await all_published(db)


async def test_stop_is_prompt_while_nats_is_down(
    db: Database, nats: NatsService, relays: RelayFactory,
) -> None:
    await nats.stop_async()
    metrics = RegistryMetrics()
    relay = await relays(db, nats.url, metrics=metrics, relay_poll_interval_s=0.05)
    await record(db, 1)
    await eventually(lambda: metric(metrics, ERRORS) >= 1, what="in its retry loop")
    await asyncio.wait_for(relay.stop(grace_s=1), 1.5)
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "event-relay"]
    assert not await all_published(db)
