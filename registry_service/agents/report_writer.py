"""Group commit for agents' reports: what arrives while one batch is written goes together
in the next.

No report waits for a timer: an idle registry writes a lone report at once, one
transaction as before, and under a burst (every agent of a fleet reporting a push
within a second or two) each batch takes what queued while the last one was written,
up to ``max_batch``. A request's answer still waits for its report's commit.

A batch the database refuses as a whole (a value in one report it cannot store, a
deadlock, a bug) is written again one report to a transaction, so that one report's
fault is that report's alone; a database that cannot be reached fails the whole batch
at once, each report with the 503 it would have had alone.

Shutdown is staged: intake stops (503, retryable: agents report again), what is queued
is written within ``grace_s``, then the task is cancelled and any report left is told
the registry is shutting down.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

from registry_service.agents.ingest import ReportIn, store_reports
from registry_service.agents.schemas import AgentOut
from registry_service.background import BackgroundTask
from registry_service.db.engine import Database, unreachable
from registry_service.errors import RegistryError, TooManyRequests, Unavailable

log = logging.getLogger(__name__)

FleetNote = Callable[[str, list[str]], None]


@dataclass(frozen=True, slots=True)
class _Pending:
    report: ReportIn
    answer: asyncio.Future[AgentOut]


def _shutting_down() -> Unavailable:
    return Unavailable("the registry is shutting down; report again", code="shutting_down")


class ReportWriter(BackgroundTask):
    """Stores agents' reports through one task, many to a transaction."""

    task_name = "report-writer"

    def __init__(self, db: Database, *, stale_after_s: float,
                 fleet_note: FleetNote | None = None, max_batch: int = 256,
                 max_queued: int = 10_000, grace_s: float = 10.0,
                 on_batch: Callable[[int], None] | None = None) -> None:
        """``fleet_note`` hears of each fleet a batch changed, after its commit, and
        ``on_batch`` of each batch's size."""
        self._db = db
        self.stale_after_s = stale_after_s
        self._fleet_note = fleet_note
        self._on_batch = on_batch
        self.max_batch = max_batch
        self.max_queued = max_queued
        self.grace_s = grace_s
        self._queue: deque[_Pending] = deque()
        self._writing: list[_Pending] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = False
        # Held from batch to batch: a checkout from the pool costs its pre-ping, three
        # round trips (BEGIN, a query, ROLLBACK), as many as the report's own statements.
        self._conn: AsyncConnection | None = None
        self.batches = 0  # transactions that stored a batch, for tests and the bench

    async def start(self) -> None:
        self._open = True
        await super().start()

    @property
    def queued(self) -> int:
        """Reports accepted and not yet answered: waiting, or in the batch being written."""
        return len(self._queue) + len(self._writing)

    async def submit(self, report: ReportIn) -> AgentOut:
        """Store ``report`` in the next batch; its stored agent, or its error raised."""
        if not self._open:
            raise _shutting_down()
        if len(self._queue) >= self.max_queued:
            raise TooManyRequests("too many reports waiting to be stored; report again",
                                  code="reports_queue_full")
        answer: asyncio.Future[AgentOut] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(report, answer))
        self._idle.clear()
        self._wake.set()
        return await answer

    async def stop(self) -> None:
        self._open = False
        try:
            async with asyncio.timeout(self.grace_s):
                await self._idle.wait()
        except TimeoutError:
            log.warning("%d status reports not stored after %.0f s; dropping them",
                        self.queued, self.grace_s)
        await super().stop()
        for pending in [*self._writing, *self._queue]:
            _fail(pending, _shutting_down())
        self._writing, self._queue = [], deque()
        await self._drop_connection()

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(SQLAlchemyError, OSError):
                await conn.close()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                self._writing = self._next_batch()
                await self._write(self._writing)
                self._writing = []
            self._idle.set()

    def _next_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        while self._queue and len(batch) < self.max_batch:
            pending = self._queue.popleft()
            if not pending.answer.done():  # its request was cancelled: nobody waits
                batch.append(pending)
        return batch

    async def _write(self, batch: list[_Pending]) -> None:
        if not batch:
            return
        try:
            await self._store_retrying(batch)
        except Unavailable as exc:
            for pending in batch:
                _fail(pending, exc)
        except Exception as exc:
            if len(batch) == 1:
                _fail(batch[0], exc)
                return
            log.warning("a batch of %d status reports failed (%s: %s); storing them one "
                        "by one", len(batch), type(exc).__name__, exc)
            for pending in batch:
                await self._write([pending])

    async def _store_retrying(self, batch: list[_Pending]) -> None:
        held = self._conn is not None
        try:
            await self._store(batch)
        except Unavailable:
            await self._drop_connection()
            if not held:
                raise
            # The connection held since the last batch was lost (the database restarted,
            # or something between closed it): once more on a new one, which the pool
            # checks before handing it out.
            await self._store(batch)

    async def _store(self, batch: list[_Pending]) -> None:
        if self._conn is None:
            try:
                self._conn = await self._db.engine.connect()
            except (SQLAlchemyError, OSError) as exc:
                raise unreachable(exc) from exc
        async with self._db.session(bind=self._conn) as session:
            stored = await store_reports(session, [pending.report for pending in batch],
                                         stale_after_s=self.stale_after_s)
            await session.commit()
        self.batches += 1
        if self._on_batch is not None:
            self._on_batch(len(batch))
        if self._fleet_note is not None:
            for base_model, agents in stored.fleets.items():
                self._fleet_note(base_model, agents)
        for pending, outcome in zip(batch, stored.outcomes, strict=True):
            if isinstance(outcome, RegistryError):
                _fail(pending, outcome)
            elif not pending.answer.done():
                pending.answer.set_result(outcome)


def _fail(pending: _Pending, exc: BaseException) -> None:
    if not pending.answer.done():
        pending.answer.set_exception(exc)
