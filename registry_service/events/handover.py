"""The relay's hand-over: rows a commit of this process hands over, published at once.

A task of its own, so a commit's rows never wait behind the relay's claiming pass (two
or three transactions; why: docs/decisions.md#a-commits-events-are-handed-to-the-relay).
While it publishes a batch, the
claiming pass leaves those rows alone (``busy``), so the two do not both send them (should
a row slip through both, its ``Nats-Msg-Id`` makes the stream keep one copy).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from sqlalchemy.exc import SQLAlchemyError

from registry_service.errors import RegistryError
from registry_service.events.models import EventRow

log = logging.getLogger(__name__)

# Publishes rows and records them; False when it could not (the claiming pass retries).
Publish = Callable[[list[EventRow]], Awaitable[bool]]


class HandOver:
    """Rows waiting to be published, and the one task that publishes them."""

    def __init__(self, publish: Publish, on_failure: Callable[[], None]) -> None:
        self._publish = publish
        self._on_failure = on_failure
        self._pending: dict[int, EventRow] = {}
        self.in_flight: frozenset[int] = frozenset()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def take(self, rows: Sequence[EventRow]) -> None:
        for row in rows:
            if row.subject:  # audit-only rows are born published
                self._pending[row.seq] = row
        self._wake.set()

    def busy(self) -> set[int]:
        """Rows the hand-over will publish or is publishing: no claim may take them."""
        return set(self._pending) | self.in_flight

    def claim(self, rows: list[EventRow]) -> list[EventRow]:
        """Of the rows a claiming pass just read, those it may publish: not those the
        hand-over is publishing; those still waiting here go with the pass instead.
        Called with no ``await`` between the read and the claim's own writes."""
        kept = [row for row in rows if row.seq not in self.in_flight]
        for row in kept:
            self._pending.pop(row.seq, None)
        return kept

    def start(self) -> None:
        self._stopped = False
        self._task = asyncio.create_task(self._run(), name="event-relay-hand-over")

    async def stop(self) -> None:
        """Cancel; rows not published are still in the outbox for the next relay."""
        task, self._task = self._task, None
        if task is not None:
            # Python 3.11's wait_for (inside nats-py's publish) can swallow a cancel that
            # arrives as the ack does; the flag and the wake-up still end the loop then.
            self._stopped = True
            task.cancel()
            self._wake.set()
            await asyncio.gather(task, return_exceptions=True)
        self._pending.clear()

    async def _run(self) -> None:
        while not self._stopped:
            await self._wake.wait()
            self._wake.clear()
            if self._stopped or not self._pending:
                continue
            rows = [self._pending[seq] for seq in sorted(self._pending)]
            self._pending.clear()
            self.in_flight = frozenset(row.seq for row in rows)
            try:
                done = await self._publish(rows)
            except (RegistryError, SQLAlchemyError) as exc:
                log.debug("hand-over of %d rows failed: %s", len(rows), exc)
                done = False
            finally:
                self.in_flight = frozenset()
            if not done:
                self._on_failure()
