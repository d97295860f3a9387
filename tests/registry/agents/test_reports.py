"""Storing a report (registry_service/agents/reports.py) on each database, directly."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import event, func, select, update

from devharness.registry import blocked_on_a_lock
from devharness.waiting import eventually
from loraplane.events import AgentStatus
from registry_service.agents.models import AgentRow
from registry_service.agents.reports import Upserted, upsert_agent_status
from registry_service.db.engine import Database
from registry_service.errors import Conflict
from tests.registry.agents.support import report, served

STALE_S = 90.0


def status(agent_id: str, version: int, *, seconds_ago: float = 0.0,
           leaving: bool = False) -> AgentStatus:
    body = report(agent_id, entries=[served("bot", version)],
                  time=datetime.now(UTC) - timedelta(seconds=seconds_ago))
    return AgentStatus.model_validate({**body, "leaving": leaving})


async def stored(db: Database, agent_id: str) -> AgentRow:
    async with db.session() as session:
        row = await session.get(AgentRow, agent_id)
        assert row is not None
        return row


def versions(status: AgentStatus | dict[str, object]) -> list[int]:
    held = status if isinstance(status, AgentStatus) else AgentStatus.model_validate(status)
    return [s.version for s in held.served]


async def test_an_older_report_is_refused_and_does_not_refresh_the_seen_time(
    db: Database,
) -> None:
    """A clock running behind (or a late retry) must not make the held status look
    fresh: the report is refused with ``stale_report`` and the row is left as it was."""
    async with db.session() as session:
        first = await upsert_agent_status(session, status("gpu-1", 2, seconds_ago=5),
                                          stale_after_s=STALE_S)
        await session.commit()
    assert (first.was_live, versions(first.status)) == (False, [2])
    before = await stored(db, "gpu-1")
    async with db.session() as session:
        with pytest.raises(Conflict) as refused:
            await upsert_agent_status(session, status("gpu-1", 1, seconds_ago=30),
                                      stale_after_s=STALE_S)
        await session.commit()
    assert refused.value.code == "stale_report" and refused.value.status == 409
    assert refused.value.detail["agent_id"] == "gpu-1"
    row = await stored(db, "gpu-1")
    assert versions(row.status) == [2]
    assert row.last_seen_at == before.last_seen_at == first.seen.last_seen_at


async def test_a_leaving_report_makes_the_agent_stale_even_when_older(db: Database) -> None:
    async with db.session() as session:
        await upsert_agent_status(session, status("gpu-1", 2), stale_after_s=STALE_S)
        await session.commit()
    async with db.session() as session:
        left = await upsert_agent_status(
            session, status("gpu-1", 1, seconds_ago=30, leaving=True), stale_after_s=STALE_S)
        await session.commit()
    assert left.was_live and versions(left.status) == [2]
    row = await stored(db, "gpu-1")
    assert datetime.now(UTC) - row.last_seen_at > timedelta(seconds=STALE_S)


async def test_two_first_reports_racing_leave_one_row_with_the_newer(
    db: Database, database_url: str,
) -> None:
    """On Postgres the second INSERT waits on the first's unique key, then fails and is
    taken as an update; SQLite serializes the two transactions instead."""
    async with db.session() as holder:
        first = await upsert_agent_status(holder, status("gpu-1", 1, seconds_ago=5),
                                          stale_after_s=STALE_S)
        second = asyncio.create_task(_upsert(db, status("gpu-1", 2)))
        if database_url.startswith("postgresql"):
            await eventually(lambda: blocked_on_a_lock(database_url),
                             what="the second report waiting on the first's row")
        await holder.commit()
    late = await second
    assert (late.was_live, versions(late.status)) == (True, [2])
    assert late.seen.first_seen_at == first.seen.first_seen_at
    async with db.session() as session:
        assert await session.scalar(select(func.count()).select_from(AgentRow)) == 1
    assert versions((await stored(db, "gpu-1")).status) == [2]


async def _upsert(db: Database, report_: AgentStatus) -> Upserted:
    async with db.session() as session:
        done = await upsert_agent_status(session, report_, stale_after_s=STALE_S)
        await session.commit()
        return done


async def test_a_row_stored_before_its_time_had_a_column_is_read_once(db: Database) -> None:
    """Rows written before migration 0008 have no ``reported_at``: the report's own
    time decides, and the next stored report fills the column in."""
    async with db.session() as session:
        await upsert_agent_status(session, status("gpu-1", 2, seconds_ago=10),
                                  stale_after_s=STALE_S)
        await session.execute(update(AgentRow).values(reported_at=None))
        await session.commit()
    async with db.session() as session:
        with pytest.raises(Conflict, match="older than the one held"):
            await upsert_agent_status(session, status("gpu-1", 1, seconds_ago=20),
                                      stale_after_s=STALE_S)
    assert (await stored(db, "gpu-1")).reported_at is None
    async with db.session() as session:
        newer = await upsert_agent_status(session, status("gpu-1", 3), stale_after_s=STALE_S)
        await session.commit()
    row = await stored(db, "gpu-1")
    assert versions(newer.status) == versions(row.status) == [3]
    assert row.reported_at == newer.status.time


async def test_a_stored_report_with_any_text_does_not_stop_the_next(db: Database) -> None:
    """A lone surrogate or a NUL is stored as a JSON escape that Postgres's ``->>``
    refuses to read (schemathesis found it); taking the next report never parses the
    stored one."""
    odd = served("bot\x00", 1, reason="\ud800 and \x00")
    for version, entries in ((1, [odd]), (2, [served("bot", 2)])):
        body = report("gpu-1", entries=entries,
                      time=datetime.now(UTC) - timedelta(seconds=10 - version))
        async with db.session() as session:
            done = await upsert_agent_status(session, AgentStatus.model_validate(body),
                                             stale_after_s=STALE_S)
            await session.commit()
        assert versions(done.status) == [version]


async def test_an_ordinary_report_is_one_statement_and_a_join_takes_the_general_path(
        db: Database) -> None:
    statements: list[str] = []

    def seen(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if "agents" in statement:
            statements.append(statement.split(None, 1)[0].upper())

    async def upsert(report: AgentStatus) -> Upserted:
        statements.clear()
        async with db.session() as session:
            done = await upsert_agent_status(session, report, stale_after_s=STALE_S)
            await session.commit()
        return done

    event.listen(db.engine.sync_engine, "before_cursor_execute", seen)
    try:
        joined = await upsert(status("gpu-1", 1, seconds_ago=2))
        # The short path's UPDATE finds no row; the general path inserts it.
        assert not joined.was_live and statements == ["UPDATE", "SELECT", "INSERT"]
        ordinary = await upsert(status("gpu-1", 2, seconds_ago=1))
        assert statements == ["UPDATE"]
        assert ordinary.was_live and versions(ordinary.status) == [2]
        assert ordinary.seen.first_seen_at == joined.seen.first_seen_at
        assert ordinary.seen.last_seen_at > joined.seen.last_seen_at
        with pytest.raises(Conflict):  # not newer: the general path, which refuses it
            await upsert(status("gpu-1", 1, seconds_ago=30))
        assert statements == ["UPDATE", "SELECT"]
        await upsert(status("gpu-1", 3, leaving=True))
        assert statements[0] == "SELECT"  # a leave never takes the short path
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", seen)
    row = await stored(db, "gpu-1")
    assert versions(row.status) == [3]
    assert datetime.now(UTC) - row.last_seen_at > timedelta(seconds=STALE_S)
