"""The outbox relay: publishes committed event rows to JetStream, exactly once per row.

Rows are written by the use cases inside their own transactions (``record_event``),
so a rolled-back transaction leaves nothing to publish and a committed one leaves a
row that stays ``published_at IS NULL`` until JetStream has acked it.

No transaction is open while the relay waits on NATS: on SQLite an open write
transaction is the database's only write lock, and a stalled NATS would stall every
writer behind it. A pass is three steps: claim a batch (a short transaction sets the
rows' ``claimed_by``/``claimed_until`` lease and commits), publish it with no
transaction open, then record what was acked (another short transaction). A relay
that dies holding a claim loses it when the lease runs out, and another relay (or the
restarted one) publishes the rows again; the same ``Nats-Msg-Id`` lets the stream's
duplicate window drop the copy.

Order: one relay publishes its batch in ``seq`` order and stops at the first failure, so
no row of a batch goes out before an earlier row of that batch. Replicas on Postgres
publish disjoint batches side by side (agents treat events as hints).

Hand-over (handover.py): a commit in this process hands its rows to the relay
(``notify``), whose hand-over task publishes them at once: no claim transaction, and no
wait for a claiming pass in progress, lies between a commit and the agents. Those rows
are not claimed; only rows this process committed are handed, and only after their
commit, so nothing goes out before it. Rows handed over before the relay has first
connected wait for that connection. If their publish fails, they are left unpublished
and the next pass claims them as any other; if this process dies first, another relay or
the restarted one does. A replica polling at the same moment may publish a handed row
too: the ``Nats-Msg-Id`` makes the stream keep one copy, as after a lost ack.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.event_signing import EventSigner
from loraplane.nats_auth import NatsSecurity
from registry_service.db.base import utcnow
from registry_service.db.engine import Database
from registry_service.errors import EventBusUnavailable, RegistryError
from registry_service.events.bus import EventBus
from registry_service.events.file_links import FileLinker
from registry_service.events.handover import HandOver
from registry_service.events.models import EventRow
from registry_service.events.service import event_json
from registry_service.metrics import RegistryMetrics
from registry_service.settings import RegistrySettings

log = logging.getLogger(__name__)

# Rows sent, or recorded as published, this many to a step of the event loop.
STEP_ROWS = 20


def _sign_all(signer: EventSigner, documents: list[dict[str, Any]]) -> list[tuple[bytes, str]]:
    """Each document as the message sent and its signature header. CPU only."""
    out: list[tuple[bytes, str]] = []
    for document in documents:
        data = json.dumps(document, separators=(",", ":")).encode()
        out.append((data, signer.header(data)))
    return out


def relay_identity() -> str:
    """Names this relay in ``claimed_by``: host and pid for an operator, plus a nonce."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class Acked:
    seq: int
    stream_seq: int


class EventRelay:
    """Owns one background task that drains the outbox into JetStream."""

    backoff_base_s = 0.25
    backoff_cap_s = 10.0
    # Failures are logged once, then every so often, not once per retry.
    log_every = 30

    def __init__(
        self, db: Database, nats_url: str, *, settings: RegistrySettings,
        metrics: RegistryMetrics, security: NatsSecurity | None = None,
        hand_over: bool = True, linker: FileLinker | None = None,
        signer: EventSigner | None = None,
    ) -> None:
        """``hand_over`` False: every row waits for a claiming pass, with no hand-over
        task (a baseline to measure the hand-over against). ``signer``
        signs every message (agents refuse unsigned ones); None: a key of this relay's
        own, which only agents told its public key accept (tests)."""
        self._db = db
        self.signer = signer or EventSigner(Ed25519PrivateKey.generate())
        self._linker = linker
        self._url = nats_url
        self._security = security
        self._settings = settings
        self._metrics = metrics
        self._bus: EventBus | None = None
        # Set once the bus is connected and the stream ensured; the hand-over waits on it.
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._hand_over = HandOver(self._publish_handed, self._wake.set) if hand_over \
            else None
        self._stopping = asyncio.Event()
        self._failures = 0
        self._passes = 0
        self.identity = relay_identity()

    @property
    def connected(self) -> bool:
        return self._bus is not None and self._bus.is_connected

    async def bus_state(self, timeout_s: float = 1.0) -> str:
        """``ok`` when NATS answers a ping within ``timeout_s``; ``disconnected`` when
        the relay holds no connection, ``unresponsive`` when it holds one NATS does not
        answer on (a frozen server, a cut network): what ``/readyz`` reports."""
        bus = self._bus
        if bus is None or not bus.is_connected:
            return "disconnected"
        return "ok" if await bus.answers(timeout_s) else "unresponsive"

    @property
    def passes(self) -> int:
        """Passes over the outbox finished so far, whether they published or failed.

        Two more passes than at some moment mean a whole pass began after it: every row
        committed before that moment has been looked at since.
        """
        return self._passes

    async def start(self) -> None:
        """Start the loop; it connects in the background, so NATS may be down now."""
        if self._task is not None:
            raise RuntimeError("the event relay is already running")
        self._loop = asyncio.get_running_loop()
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name="event-relay")
        if self._hand_over is not None:
            self._hand_over.start()

    def notify(self, rows: Sequence[EventRow] = ()) -> None:
        """Wake the loop now, handing it ``rows`` (called right after a commit that
        wrote them)."""
        loop = self._loop
        if loop is None or self._stopping.is_set():
            return
        try:
            same_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            same_loop = False
        if same_loop:
            self._take(rows)
            return
        # A commit on another thread; a loop that has closed has no relay left to wake.
        with suppress(RuntimeError):
            loop.call_soon_threadsafe(self._take, rows)

    def _take(self, rows: Sequence[EventRow]) -> None:
        if self._hand_over is None:
            self._wake.set()
        else:
            self._hand_over.take(rows)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Take no new batch, let the one in flight finish within ``grace_s``, then cancel.

        A cancelled batch's rows are handed back at once (not left to their lease), so the
        next relay publishes them without delay; JetStream drops the duplicates.
        """
        self._stopping.set()
        self._wake.set()
        if self._hand_over is not None:
            await self._hand_over.stop()
        task, self._task = self._task, None
        if task is not None:
            _done, pending = await asyncio.wait({task}, timeout=grace_s)
            if pending:
                log.warning("the event relay did not finish within %.1fs; cancelling", grace_s)
                task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                # Swallow the relay task's cancellation, never one aimed at our caller.
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
            if pending:
                await self._release_claims()
        self._ready.clear()
        if self._bus is not None:
            await self._bus.close()
            self._bus = None

    async def _run(self) -> None:
        while not self._stopping.is_set():
            # Cleared before the pass: a commit during the pass triggers one more.
            self._wake.clear()
            try:
                more = await self._pass()
            except RegistryError as exc:
                await self._after_failure(exc)
                continue
            except Exception as exc:
                log.exception("event relay pass failed")
                await self._after_failure(exc)
                continue
            self._passes += 1
            self._recovered()
            if not more:
                await self._idle()

    async def _pass(self) -> bool:
        """Publish one batch; True when a full batch went out (more may be waiting)."""
        bus = await self._ready_bus()
        started = time.monotonic()
        rows = await self._claim()
        # Stop taking rows while enough of the lease is left for one more publish:
        # past the lease, another relay may be publishing the same rows.
        deadline = started + self._settings.relay_claim_lease_s - bus.request_timeout_s
        acked, failure = await self._publish_rows(bus, rows, deadline)
        backlog = await self._record(acked, rows)
        self._metrics.events_published.inc(len(acked))
        self._metrics.set_outbox(*backlog)
        if failure is not None:
            raise failure
        return len(rows) == self._settings.relay_batch_size

    async def _publish_handed(self, rows: list[EventRow]) -> bool:
        """Publish rows a commit handed over, with no claim; False if not all went
        out (the claiming pass then takes the rest, with its backoff).

        Rows handed over before the first pass has connected wait for it here: left to
        a claiming pass, they would wait for the poll interval (or for ever, where
        another relay's claim is live)."""
        await self._ready.wait()
        bus = self._bus
        if bus is None or not bus.is_connected:
            return False
        deadline = time.monotonic() + self._settings.relay_claim_lease_s
        acked, failure = await self._publish_rows(bus, rows, deadline)
        await self._record(acked, rows)
        self._metrics.events_published.inc(len(acked))
        return failure is None

    async def _ready_bus(self) -> EventBus:
        if self._bus is not None and self._bus.is_closed:
            self._bus = None
            self._ready.clear()
        if self._bus is None:
            bus = EventBus(self._url, security=self._security,
                           request_timeout_s=self._settings.relay_publish_timeout_s)
            await bus.connect()
            self._bus = bus  # _ready is clear: it is cleared whenever the bus is dropped
        if not self._ready.is_set():
            await self._bus.ensure_stream()
            self._ready.set()
        return self._bus

    async def _claim(self) -> Sequence[EventRow]:
        """Lease the next batch to this relay in one short transaction."""
        now = utcnow()
        claimable = or_(
            EventRow.claimed_until.is_(None),
            EventRow.claimed_until <= now,
            # Our own claims: a pass that failed before releasing them.
            EventRow.claimed_by == self.identity,
        )
        query = (
            select(EventRow)
            .where(EventRow.published_at.is_(None), claimable)
            .order_by(EventRow.seq)
            .limit(self._settings.relay_batch_size)
        )
        busy = self._hand_over.busy() if self._hand_over is not None else set()
        if busy:
            query = query.where(EventRow.seq.not_in(busy))
        if self._db.is_postgres:
            # Rows another replica is claiming right now are skipped, not waited for.
            # SQLite needs nothing: every transaction there starts with BEGIN IMMEDIATE.
            query = query.with_for_update(skip_locked=True)
        until = now + timedelta(seconds=self._settings.relay_claim_lease_s)
        async with self._db.session() as session:
            rows = list(await session.scalars(query))
            if self._hand_over is not None:
                # A commit may have handed some over since the query was built.
                rows = self._hand_over.claim(rows)
            if rows:
                # One statement, not the ORM's flush of each row (which held the loop).
                await session.execute(
                    update(EventRow).where(EventRow.seq.in_([row.seq for row in rows]))
                    .values(claimed_by=self.identity, claimed_until=until)
                    .execution_options(synchronize_session=False))
            await session.commit()
        return rows

    async def _publish_rows(
        self, bus: EventBus, rows: Sequence[EventRow], deadline: float,
    ) -> tuple[list[Acked], EventBusUnavailable | None]:
        """Send the rows in order without waiting, then collect their acks: a batch
        reaches the agents together. A failure keeps the acks before and after it (a
        row published again later is a duplicate the stream drops, by its msg id)."""
        # Encoded first: signing the file links may wait, and the client would send
        # each row on its own while it does.
        signed = await self._signed(rows)
        sent: list[tuple[EventRow, float, Callable[[], Awaitable[int]]]] = []
        failure: EventBusUnavailable | None = None
        for i, (row, data, signature) in enumerate(signed):
            if time.monotonic() > deadline:
                break
            if i and i % STEP_ROWS == 0:
                await asyncio.sleep(0)  # a send does not wait: let the loop go between steps
            try:
                sent.append((row, time.perf_counter(),
                             await bus.send(row.subject, data, row.event_id,
                                            signature=signature)))
            except EventBusUnavailable as exc:
                failure = exc
                break
        acked: list[Acked] = []
        for row, started, wait in sent:
            try:
                acked.append(Acked(row.seq, await wait()))
            except EventBusUnavailable as exc:
                failure = failure or exc
                continue
            self._metrics.relay_publish.observe(time.perf_counter() - started)
        if failure is not None:
            # The stream may be gone (a fresh server); check it before the retry.
            self._ready.clear()
        return acked, failure

    async def _signed(self, rows: Sequence[EventRow]) -> list[tuple[EventRow, bytes, str]]:
        """Each row's message and its signature, written and signed on a worker thread:
        a batch of a hundred would hold the loop."""
        if self._linker is None:
            documents = [event_json(row) for row in rows]
        else:
            documents = [await self._linker.link(event_json(row)) for row in rows]
        signed = await asyncio.to_thread(_sign_all, self.signer, documents)
        return [(row, data, signature)
                for row, (data, signature) in zip(rows, signed, strict=True)]

    async def _record(self, acked: Sequence[Acked],
                      rows: Sequence[EventRow]) -> tuple[int, datetime | None]:
        """Mark the acked rows published, hand back the rest of the claim; return the
        backlog (``_backlog``)."""
        done = {a.seq for a in acked}
        rest = [row.seq for row in rows if row.seq not in done]
        now = utcnow()
        async with self._db.session() as session:
            for start in range(0, len(acked), STEP_ROWS):
                # A step at a time: a hundred rows in one ``executemany`` would hold
                # the loop.
                await session.execute(update(EventRow), [
                    {"seq": a.seq, "stream_seq": a.stream_seq, "published_at": now,
                     "claimed_by": None, "claimed_until": None}
                    for a in acked[start:start + STEP_ROWS]])
            if rest:
                # Released now, so another replica need not wait for the lease to end.
                await session.execute(
                    update(EventRow)
                    .where(EventRow.seq.in_(rest), EventRow.claimed_by == self.identity)
                    .values(claimed_by=None, claimed_until=None))
            backlog = await self._backlog(session)
            await session.commit()
        return backlog

    async def _release_claims(self) -> None:
        try:
            async with self._db.session() as session:
                await session.execute(
                    update(EventRow)
                    .where(EventRow.claimed_by == self.identity, EventRow.published_at.is_(None))
                    .values(claimed_by=None, claimed_until=None))
                await session.commit()
        except (RegistryError, SQLAlchemyError) as exc:
            # The lease runs out on its own; the rows are only late.
            log.warning("could not hand back the relay's claimed rows: %s", exc)

    async def _backlog(self, session: AsyncSession) -> tuple[int, datetime | None]:
        """How many rows are unpublished, and when the oldest of them was committed."""
        query = (select(func.count(), func.min(EventRow.created_at))
                 .where(EventRow.published_at.is_(None)))
        count, oldest = (await session.execute(query)).one()
        return int(count or 0), oldest

    async def _after_failure(self, exc: Exception) -> None:
        self._passes += 1
        self._failed(exc)
        await self._show_pending()
        await self._backoff()

    async def _show_pending(self) -> None:
        """Count the queue after a failed pass too: a pass that could not even connect
        never reaches ``_record``, and the gauge must show the rows piling up."""
        try:
            async with self._db.session() as session:
                self._metrics.set_outbox(*await self._backlog(session))
        except (RegistryError, SQLAlchemyError) as exc:
            log.warning("could not count the relay's pending rows: %s", exc)

    def _failed(self, exc: Exception) -> None:
        self._failures += 1
        self._metrics.relay_errors.inc()
        if self._failures == 1 or self._failures % self.log_every == 0:
            reason = exc.message if isinstance(exc, RegistryError) else repr(exc)
            detail = exc.detail if isinstance(exc, RegistryError) else {}
            log.warning("event relay cannot publish (attempt %d): %s %s; events stay queued",
                        self._failures, reason, detail)

    def _recovered(self) -> None:
        if self._failures:
            log.info("event relay recovered after %d failed attempts", self._failures)
        self._failures = 0

    def backoff_delay(self) -> float:
        """Capped exponential backoff with jitter, so replicas do not retry in step."""
        exponent = min(self._failures - 1, 30)
        ceiling = min(self.backoff_cap_s, self.backoff_base_s * 2.0**max(exponent, 0))
        return random.uniform(ceiling / 2, ceiling)

    async def _backoff(self) -> None:
        # Only stop() cuts a backoff short: new commits must not turn it into a spin.
        with suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), self.backoff_delay())

    async def _idle(self) -> None:
        with suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self._settings.relay_poll_interval_s)
