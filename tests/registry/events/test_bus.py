"""EventBus against a real NATS JetStream: sends in flight together, acks in order."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats as nats_py
import pytest

from devharness.services import NatsService
from loraplane.events import STREAM_NAME, subject_for
from registry_service.errors import EventBusUnavailable
from registry_service.events.bus import EventBus


@pytest.fixture
async def bus(nats: NatsService) -> AsyncIterator[EventBus]:
    bus = EventBus(nats.url, request_timeout_s=5)
    await bus.connect()
    await bus.ensure_stream()
    try:
        yield bus
    finally:
        await bus.close()


async def test_sends_in_flight_together_are_stored_in_order(
        bus: EventBus, nats: NatsService) -> None:
    subject = subject_for("acme", "bot")
    waits = [await bus.send(subject, f"event {n}".encode(), f"id-{n}") for n in range(5)]
    seqs = [await wait() for wait in waits]
    assert seqs == list(range(seqs[0], seqs[0] + 5))
    # The same msg id again is the stream's duplicate: acked with the first copy's number.
    assert await bus.publish(subject, b"event 2 again", "id-2") == seqs[2]
    client = await nats_py.connect(nats.url)
    try:
        js = client.jetstream()
        stored = [(await js.get_msg(STREAM_NAME, seq)).data for seq in seqs]
        assert stored == [f"event {n}".encode() for n in range(5)]
        assert (await js.stream_info(STREAM_NAME)).state.messages == 5
    finally:
        await client.close()


async def test_a_send_no_stream_takes_fails_with_the_bus_error(bus: EventBus) -> None:
    wait = await bus.send("not.in.the.stream", b"x", "id-x")
    with pytest.raises(EventBusUnavailable):
        await wait()


async def test_an_ack_that_never_comes_times_out(nats: NatsService) -> None:
    bus = EventBus(nats.url, request_timeout_s=0.5)
    await bus.connect()
    await bus.ensure_stream()
    try:
        nats.stop()
        # Sent into the client's buffer while it reconnects, or refused outright.
        with pytest.raises(EventBusUnavailable):
            wait = await bus.send(subject_for("acme", "bot"), b"x", "id-lost")
            await wait()
    finally:
        await bus.close()
