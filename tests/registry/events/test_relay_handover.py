"""A commit hands its outbox rows to the relay, which publishes them with no claim.

The claim's transaction used to sit between every commit and its event reaching the
agents; now only rows nobody handed over (another process's, or a failed hand-over's)
wait for a claim.
"""

from __future__ import annotations

from datetime import timedelta

from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError
from sqlalchemy import select

from devharness.services import NatsService
from devharness.waiting import eventually
from loraplane.events import AdapterDeleted
from registry_service.db.base import utcnow
from registry_service.db.engine import Database
from registry_service.events.bus import MSG_ID_HEADER
from registry_service.events.models import EventRow
from registry_service.events.service import envelope, record_event
from tests.registry.events.conftest import RelayFactory
from tests.registry.events.support import stream_count, stream_messages


async def test_a_committed_row_is_published_by_hand_over_even_while_another_relay_claims_it(
    db: Database, nats: NatsService, relays: RelayFactory, js: JetStreamContext,
) -> None:
    # No poll: only the commit's hand-over (or its wake-up pass) can publish.
    await relays(db, nats.url, relay_poll_interval_s=3600)
    async with db.session() as session:
        row = record_event(session, AdapterDeleted(**envelope("acme", "handed"),
                                                   base_model="tiny"), actor="tests")
        # A live relay elsewhere holds the claim: no claiming pass here may take the
        # row, so only the hand-over can publish it.
        row.claimed_by, row.claimed_until = "other-relay", utcnow() + timedelta(hours=1)
        await session.commit()

    async def published() -> bool:
        if await stream_count(js) == 0:
            return False
        return [m.headers.get(MSG_ID_HEADER) for m in await stream_messages(js)
                if m.headers] == [row.event_id]

    # The stream is made by the relay's first connection: not there yet is "not yet".
    await eventually(published, what="the handed row on the stream",
                     retrying=(NotFoundError,))

    async def recorded() -> EventRow | None:
        async with db.session() as session:
            found = await session.scalar(select(EventRow).where(EventRow.seq == row.seq))
        return found if found is not None and found.published_at is not None else None

    stored = await eventually(recorded, what="the handed row marked published")
    assert stored.stream_seq is not None
