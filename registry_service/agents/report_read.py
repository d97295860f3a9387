"""Reading every agent's stored report without holding the event loop.

A fleet's reports are large (an agent serving 500 adapters reports about 100 KB), and
every fleet view reads all of them: the rollouts, ``/ui``'s stream, the metrics' fleet
gauges. Turning them into models is CPU work that grows with the fleet, so it is done on
a worker thread: the query asks for each report as text (the JSON column's reader would
parse all of them on the loop), and ``parse_reports``, which touches no loop object,
runs off the loop.
"""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import NamedTuple

from pydantic import ValidationError
from sqlalchemy import Text, cast, select
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.events import AgentStatus
from registry_service.agents.models import AgentRow
from registry_service.agents.rollout import AgentReport
from registry_service.db.base import as_utc


class _GcPause:
    """Nested and concurrent holders share one pause; the last one out restores it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._was_enabled = False

    def enter(self) -> None:
        with self._lock:
            if self._holders == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._holders += 1

    def leave(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0 and self._was_enabled:
                gc.enable()


_GC_PAUSE = _GcPause()


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off while a fleet's models are built and let go (hundreds of
    thousands of them, in no cycle: reference counting frees them). A pass of the oldest
    generation walks every object of the process holding the GIL, so it stops the event
    loop's thread too: passes of 200-400 ms during one look at 100 agents reporting 500
    adapters each."""
    _GC_PAUSE.enter()
    try:
        yield
    finally:
        _GC_PAUSE.leave()


class StoredReport(NamedTuple):
    """An agent's row with its report still as JSON text."""
    agent_id: str
    base_model: str
    first_seen_at: datetime
    last_seen_at: datetime
    status_json: str


async def stored_reports(session: AsyncSession,
                         base_model: str | None = None) -> list[StoredReport]:
    """Every agent's row (of ``base_model``, if given), by agent id, reports unparsed."""
    query = select(AgentRow.agent_id, AgentRow.base_model, AgentRow.first_seen_at,
                   AgentRow.last_seen_at, cast(AgentRow.status, Text))
    if base_model is not None:
        query = query.where(AgentRow.base_model == base_model)
    rows = await session.execute(query.order_by(AgentRow.agent_id))
    return [StoredReport(*row) for row in rows]


def parse_status(row: StoredReport) -> AgentStatus:
    try:
        return AgentStatus.model_validate_json(row.status_json)
    except ValidationError:
        # What pydantic's JSON reader refuses and the standard library's reads (a lone
        # surrogate's escape, written for a report that did not come over HTTP).
        return AgentStatus.model_validate(json.loads(row.status_json))


def parse_reports(rows: list[StoredReport], now: datetime,
                  stale_after_s: float) -> list[AgentReport]:
    """The reports as models, each marked stale or not at ``now``. CPU only: run it on a
    worker thread (``asyncio.to_thread``)."""
    return [AgentReport(agent_id=row.agent_id, base_model=row.base_model,
                        stale=(as_utc(now) - as_utc(row.last_seen_at)).total_seconds()
                        > stale_after_s,
                        status=parse_status(row))
            for row in rows]
