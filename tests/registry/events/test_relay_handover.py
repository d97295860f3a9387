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
from devharness.tcp_pause import PausableTcpProxy
from devharness.waiting import eventually
from loraplane.events import AdapterDeleted
from registry_service.db.base import utcnow
from registry_service.db.engine import Database
from registry_service.events.bus import MSG_ID_HEADER
from registry_service.events.models import EventRow
from registry_service.events.service import envelope, record_event
from tests.registry.events.conftest import RelayFactory
from tests.registry.events.support import stream_count, stream_messages


async def _commit_claimed_elsewhere(db: Database, name: str) -> EventRow:
    """Commit an event row that a live relay elsewhere holds the claim on: no claiming
    pass here may take it, so only the hand-over can publish it."""
    async with db.session() as session:
        row = record_event(session, AdapterDeleted(**envelope("acme", name),
                                                   base_model="tiny"), actor="tests")
        row.claimed_by, row.claimed_until = "other-relay", utcnow() + timedelta(hours=1)
        await session.commit()
    return row


async def _on_the_stream_alone(js: JetStreamContext, row: EventRow) -> bool:
    if await stream_count(js) == 0:
        return False
    return [m.headers.get(MSG_ID_HEADER) for m in await stream_messages(js)
            if m.headers] == [row.event_id]


async def test_a_committed_row_is_published_by_hand_over_even_while_another_relay_claims_it(
    db: Database, nats: NatsService, relays: RelayFactory, js: JetStreamContext,
) -> None:
    # No poll: only the commit's hand-over (or its wake-up pass) can publish.
    await relays(db, nats.url, relay_poll_interval_s=3600)
    row = await _commit_claimed_elsewhere(db, "handed")

    # The stream is made by the relay's first connection: not there yet is "not yet".
    await eventually(lambda: _on_the_stream_alone(js, row),
                     what="the handed row on the stream", retrying=(NotFoundError,))

    async def recorded() -> EventRow | None:
        async with db.session() as session:
            found = await session.scalar(select(EventRow).where(EventRow.seq == row.seq))
        return found if found is not None and found.published_at is not None else None

    stored = await eventually(recorded, what="the handed row marked published")
    assert stored.stream_seq is not None


async def test_a_row_handed_over_before_the_relay_has_connected_waits_for_the_connection(
    db: Database, nats: NatsService, relays: RelayFactory, js: JetStreamContext,
) -> None:
    """CI (7d0f4a6) once committed before the first pass had connected: the hand-over
    gave up, and the other relay's claim kept every pass off the row."""
    # While held, NATS answers nothing: the relay cannot finish connecting.
    with PausableTcpProxy(nats.url, marker=b"CONNECT", first_event=b"") as proxy:
        proxy.hold()
        relay = await relays(db, proxy.url.replace("http://", "nats://"),
                             relay_poll_interval_s=3600)
        row = await _commit_claimed_elsewhere(db, "early")
        await eventually(lambda: relay.passes >= 1, what="a pass that could not connect")
        assert not relay.connected
        proxy.release()

        await eventually(lambda: _on_the_stream_alone(js, row),
                         what="the early row on the stream", retrying=(NotFoundError,))
