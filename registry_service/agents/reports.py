"""Storing an agent's report: the one write every agent makes after every change.

At a push every agent of the fleet reports, so this is what the registry's cost per
event grows with. The stored report (hundreds of entries) is therefore never read
back to store the next one: its time is kept in a column of its own
(``reported_at``), and the row is updated in one statement.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, NamedTuple, cast

from pydantic import TypeAdapter
from pydantic_core import PydanticSerializationError
from sqlalchemy import JSON, Table, bindparam, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.events import AgentStatus
from registry_service.agents.models import AgentRow
from registry_service.db.base import UTCDateTime, as_utc, utcnow
from registry_service.db.engine import JsonText
from registry_service.errors import Conflict

_TIME = TypeAdapter(datetime)


class Seen(NamedTuple):
    """An agent's row without its report, as it is after the upsert."""
    agent_id: str
    base_model: str
    first_seen_at: datetime
    last_seen_at: datetime


class Upserted(NamedTuple):
    seen: Seen
    was_live: bool  # of the report's base model, before this report
    status: AgentStatus  # the report the row holds now: this one, unless it held a newer


class _Stored(NamedTuple):
    base_model: str
    first_seen_at: datetime
    last_seen_at: datetime
    reported_at: datetime  # the stored report's own time


def _as_json(status: AgentStatus) -> JsonText | dict[str, Any]:
    try:
        return JsonText(status.model_dump_json())
    except PydanticSerializationError:
        # Text that is not Unicode (a lone surrogate, which only a report that came
        # some other way than JSON can hold): the JSON column's writer escapes it.
        return status.model_dump(mode="json")


async def _locked(session: AsyncSession, agent_id: str) -> _Stored | None:
    """The row's columns and its report's time, locked until the commit."""
    row = (await session.execute(
        select(AgentRow.base_model, AgentRow.first_seen_at, AgentRow.last_seen_at,
               AgentRow.reported_at)
        .where(AgentRow.agent_id == agent_id).with_for_update())).one_or_none()
    if row is None:
        return None
    base_model, first_seen_at, last_seen_at, reported_at = row
    if reported_at is None:  # stored before migration 0008: read from the report, once
        report = await session.scalar(select(AgentRow.status)
                                      .where(AgentRow.agent_id == agent_id))
        reported_at = _TIME.validate_python((report or {}).get("time"))
    return _Stored(base_model, first_seen_at, last_seen_at, reported_at)


def _newer_than_stored(stored: _Stored, status: AgentStatus, now: datetime) -> bool:
    # Retried requests can arrive out of order; an older report never replaces a newer.
    # A row stored before times were capped may lie in the future: it counts as now.
    return as_utc(status.time) >= min(as_utc(stored.reported_at), now)


def _was_live(stored: _Stored | None, base_model: str, since: datetime) -> bool:
    return (stored is not None and stored.base_model == base_model
            and as_utc(stored.last_seen_at) >= since)


def _seen_at(leaving: bool, last_seen_at: datetime, now: datetime,
             since: datetime) -> datetime:
    # A second more than the window: stale whatever clock reading compares it next.
    return min(as_utc(last_seen_at), since - timedelta(seconds=1)) if leaving else now


async def _insert(session: AsyncSession, status: AgentStatus, now: datetime,
                  last_seen_at: datetime) -> bool:
    """Whether the row was inserted; False if another first report inserted it."""
    try:
        async with session.begin_nested():
            session.add(AgentRow(agent_id=status.agent_id, base_model=status.base_model,
                                 status=status.model_dump(mode="json"),
                                 reported_at=as_utc(status.time), first_seen_at=now,
                                 last_seen_at=last_seen_at))
        return True
    except IntegrityError:
        return False


async def _write(session: AsyncSession, agent_id: str, **values: object) -> None:
    await session.execute(update(AgentRow).where(AgentRow.agent_id == agent_id)
                          .values(**values).execution_options(synchronize_session=False))


# Almost every report takes this one statement: built once (composing it per report was
# a quarter of the writer's CPU). Core, on the table: no ORM bulk-update machinery.
_AGENTS = cast(Table, AgentRow.__table__)
_ORDINARY = (
    update(_AGENTS)
    .where(_AGENTS.c.agent_id == bindparam("p_agent_id"),
           _AGENTS.c.base_model == bindparam("p_base_model"),
           _AGENTS.c.last_seen_at >= bindparam("p_since", type_=UTCDateTime()),
           _AGENTS.c.reported_at <= bindparam("p_reported_at", type_=UTCDateTime()))
    .values(last_seen_at=bindparam("p_now", type_=UTCDateTime()),
            status=bindparam("p_status", type_=JSON()),
            reported_at=bindparam("p_reported_at_new", type_=UTCDateTime()))
    .returning(_AGENTS.c.first_seen_at)
)


async def _store_ordinary(session: AsyncSession, status: AgentStatus, now: datetime,
                          since: datetime) -> datetime | None:
    """Almost every report: a live agent of the same base model, not leaving, newer than
    the report stored. Written in one UPDATE, which takes the row's lock as the
    ``SELECT ... FOR UPDATE`` of the general case would. Its ``first_seen_at``, or None
    for any other report, which the general case decides."""
    if status.leaving:
        return None
    reported_at = as_utc(status.time)
    first_seen_at: datetime | None = await session.scalar(_ORDINARY, {
        "p_agent_id": status.agent_id, "p_base_model": status.base_model,
        "p_since": since, "p_reported_at": reported_at, "p_now": now,
        "p_status": _as_json(status), "p_reported_at_new": reported_at})
    return first_seen_at


async def upsert_agent_status(session: AsyncSession, status: AgentStatus, *,
                              stale_after_s: float) -> Upserted:
    """Store a report and mark the agent seen now; the caller commits.

    Also the entry point for reports that arrive some other way than HTTP. The report's
    time is capped at the registry's clock: an agent whose clock runs ahead would
    otherwise make every later report look older, and its status would freeze. A report
    older than the one held is refused (409 ``stale_report``) and changes nothing, not
    even ``last_seen_at``. A leaving agent's report makes it stale at once, even one
    older than the stored.
    """
    now = utcnow()
    if as_utc(status.time) > now:
        status = status.model_copy(update={"time": now})
    since = now - timedelta(seconds=stale_after_s)
    agent_id = status.agent_id
    first_seen_at = await _store_ordinary(session, status, now, since)
    if first_seen_at is not None:
        return Upserted(Seen(agent_id, status.base_model, first_seen_at, now), True, status)
    stored = await _locked(session, agent_id)
    if stored is None:
        last = _seen_at(status.leaving, now, now, since)
        if await _insert(session, status, now, last):
            return Upserted(Seen(agent_id, status.base_model, now, last), False, status)
        # Its first two reports raced and the other one inserted the row.
        stored = await _locked(session, agent_id)
        if stored is None:
            raise RuntimeError(f"agent {agent_id!r}: its row was inserted and is gone")
    was_live = _was_live(stored, status.base_model, since)
    last = _seen_at(status.leaving, stored.last_seen_at, now, since)
    if _newer_than_stored(stored, status, now):
        await _write(session, agent_id, last_seen_at=last, base_model=status.base_model,
                     status=_as_json(status), reported_at=as_utc(status.time))
        return Upserted(Seen(agent_id, status.base_model, stored.first_seen_at, last),
                        was_live, status)
    if not status.leaving:
        # Older than the report held (a retry that arrived late, or a clock that runs
        # behind or stepped back): refused, and the agent is not marked seen, so the
        # fleet never shows the held report as fresh on the strength of an old one.
        raise _stale(status, stored.reported_at)
    held = await session.scalar(
        update(AgentRow).where(AgentRow.agent_id == agent_id).values(last_seen_at=last)
        .returning(AgentRow.status).execution_options(synchronize_session=False))
    return Upserted(Seen(agent_id, stored.base_model, stored.first_seen_at, last),
                    was_live, AgentStatus.model_validate(held))


def _stale(status: AgentStatus, held_time: datetime) -> Conflict:
    return Conflict(
        f"agent {status.agent_id!r}: this report ({as_utc(status.time).isoformat()}) is "
        f"older than the one held ({as_utc(held_time).isoformat()}); it is not stored and "
        "the agent is not marked seen (is its clock behind?)", code="stale_report",
        detail={"agent_id": status.agent_id, "report_time": as_utc(status.time).isoformat(),
                "held_time": as_utc(held_time).isoformat()})
