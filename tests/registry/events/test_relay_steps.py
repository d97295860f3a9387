"""A relay pass over a full batch does not hold the event loop (issue 41): its messages are
written and signed on a worker thread, and sent a few at a time with the loop let go
between, so other tasks run while a batch of a hundred goes out.

Checked structurally, with a probe task that counts its own turns: each send records the
count, and the sends of one batch must see it move several times."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from devharness.waiting import eventually
from loraplane.event_signing import EventSigner
from registry_service.db.engine import Database
from registry_service.events.bus import EventBus
from tests.loop_steps import probing
from tests.registry.events.conftest import RelayFactory
from tests.registry.events.support import all_published, record

BATCH = 100


async def test_a_full_batch_is_signed_off_the_loop_and_sent_in_steps(
    db: Database, nats: Any, relays: RelayFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    turns: list[str] = []
    await record(db, BATCH)  # committed before the relay starts: one claiming pass
    seen_at_send: list[int] = []
    signed_on_loop: list[bool] = []
    loop_thread = threading.get_ident()
    send, header = EventBus.send, EventSigner.header

    async def counted_send(bus: EventBus, *args: Any, **kwargs: Any) -> Any:
        seen_at_send.append(len(turns))
        return await send(bus, *args, **kwargs)

    def watched_header(signer: EventSigner, data: bytes) -> str:
        signed_on_loop.append(threading.get_ident() == loop_thread)
        return header(signer, data)

    monkeypatch.setattr(EventBus, "send", counted_send)
    monkeypatch.setattr(EventSigner, "header", watched_header)
    async with probing(turns):
        await relays(db, nats.url, relay_batch_size=BATCH)
        await eventually(lambda: all_published(db), timeout_s=30, what="the batch published")
    assert len(seen_at_send) == BATCH and len(signed_on_loop) == BATCH
    assert not any(signed_on_loop)
    # The probe ran between the batch's sends, again and again: no step sent them all.
    assert len(set(seen_at_send)) >= 4, seen_at_send
