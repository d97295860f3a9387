"""PullStream against a real NATS JetStream: one standing request, renewed when it ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import nats as nats_py
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.client import JetStreamContext

from devharness.services import NatsService
from devharness.waiting import eventually
from inference_agent.control.pull import PullRefused, PullStream

STREAM = "PULLTEST"
CONSUMER = "reader"


@dataclass
class Bus:
    client: NatsClient
    js: JetStreamContext

    async def publish(self, count: int, start: int = 0) -> None:
        for n in range(start, start + count):
            await self.js.publish(f"pull.test.{n}", str(n).encode())


@pytest.fixture
async def bus(nats: NatsService) -> AsyncIterator[Bus]:
    client = await nats_py.connect(nats.url)
    js = client.jetstream()
    await js.add_stream(name=STREAM, subjects=["pull.test.>"])
    await js.add_consumer(STREAM, ConsumerConfig(durable_name=CONSUMER,
                                                 ack_policy=AckPolicy.EXPLICIT))
    try:
        yield Bus(client, js)
    finally:
        await client.close()


async def read(pull: PullStream, count: int) -> list[str]:
    got = []
    for _ in range(count):
        msg = await pull.next(timeout_s=20)
        await msg.ack()
        got.append(msg.data.decode())
    return got


async def test_events_flow_to_one_standing_request(bus: Bus) -> None:
    pull = PullStream(bus.client, STREAM, CONSUMER)
    await pull.open()
    await bus.publish(5)
    assert await read(pull, 5) == ["0", "1", "2", "3", "4"]
    await bus.publish(3, start=5)
    assert await read(pull, 3) == ["5", "6", "7"]
    assert pull.requests == 1


async def test_a_request_whose_batch_is_delivered_is_renewed(bus: Bus) -> None:
    pull = PullStream(bus.client, STREAM, CONSUMER, batch=2)
    await pull.open()
    await bus.publish(5)
    assert await read(pull, 5) == ["0", "1", "2", "3", "4"]
    assert pull.requests == 3  # 2 + 2 + 1


async def test_an_expired_request_is_renewed(bus: Bus) -> None:
    pull = PullStream(bus.client, STREAM, CONSUMER, expires_s=1.0, heartbeat_s=0.2)
    await pull.open()
    # Wait (in short waits) until the first request has run out and a second stands.
    async with asyncio.timeout(30):
        while pull.requests < 2:
            with pytest.raises(nats_py.errors.TimeoutError):
                await pull.next(timeout_s=0.3)
    await bus.publish(1)
    assert await read(pull, 1) == ["0"]


async def test_a_deleted_consumer_refuses_the_standing_request(bus: Bus) -> None:
    pull = PullStream(bus.client, STREAM, CONSUMER)
    await pull.open()
    waiting = asyncio.create_task(pull.next(timeout_s=30))
    await eventually(lambda: pull.requests == 1, timeout_s=30, what="a standing request")
    # The request is on the server once a round trip after it is done.
    await bus.client.flush()
    await bus.js.delete_consumer(STREAM, CONSUMER)
    with pytest.raises(PullRefused) as info:
        await waiting
    assert info.value.status == "409"


async def delivered(bus: Bus, waiting: int) -> PullStream:
    """A stream that has taken message "0" and holds the next ``waiting`` delivered."""
    pull = PullStream(bus.client, STREAM, CONSUMER)
    await pull.open()
    await bus.publish(1 + waiting)
    assert await read(pull, 1) == ["0"]
    await eventually(lambda: pull.waiting == waiting, timeout_s=30, what="the delivery")
    return pull


async def test_messages_already_delivered_are_taken_without_waiting(bus: Bus) -> None:
    pull = await delivered(bus, 2)
    # Nothing else runs while they are taken: not the client's flusher, so the acks of
    # events that came together leave in one write.
    others_ran = asyncio.Event()
    asyncio.get_running_loop().call_soon(others_ran.set)
    first, second = await pull.next(timeout_s=1), await pull.next(timeout_s=1)
    assert not others_ran.is_set()
    assert [first.data, second.data] == [b"1", b"2"] and pull.waiting == 0


async def test_a_closed_client_is_said_once_nothing_is_waiting(bus: Bus) -> None:
    pull = await delivered(bus, 1)
    await bus.client.close()
    assert (await pull.next(timeout_s=1)).data == b"1"  # delivered before the close
    with pytest.raises(nats_py.errors.ConnectionClosedError):
        await pull.next(timeout_s=1)


def test_the_heartbeat_must_fit_the_expiry_twice() -> None:
    with pytest.raises(ValueError, match="heartbeat"):
        PullStream(NatsClient(), STREAM, CONSUMER, expires_s=1.0, heartbeat_s=0.5)
