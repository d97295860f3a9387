"""Stopping the hand-over ends its task even when the cancel is swallowed: Python 3.11's
``asyncio.wait_for`` (inside nats-py's publish) returns the result instead of raising
when the cancel and the ack arrive together, which left the task waiting for a wake-up
that never came (seen as a relay benchmark hanging in CI)."""

from __future__ import annotations

import asyncio

from registry_service.events.handover import HandOver
from registry_service.events.models import EventRow


async def test_stop_ends_a_task_whose_publish_swallowed_the_cancel() -> None:
    publishing = asyncio.Event()

    async def publish(_rows: list[EventRow]) -> bool:
        publishing.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return True  # what wait_for does when the ack wins the race
        return True

    hand_over = HandOver(publish, on_failure=lambda: None)
    hand_over.start()
    hand_over.take([EventRow(seq=1, subject="loraplane.events.acme.x")])
    await asyncio.wait_for(publishing.wait(), 30)

    await asyncio.wait_for(hand_over.stop(), 30)  # hung forever before the fix

    assert hand_over.busy() == set()
