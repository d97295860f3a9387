"""Agents' reports stored many to a transaction (registry_service/agents/report_writer.py
and ingest.py), on each database, directly."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import select, text

from devharness.registry import reset_postgres
from devharness.services import PostgresDatabase
from devharness.waiting import eventually
from loraplane.events import AgentStatus, FleetChanged, parse_event
from registry_service.agents.ingest import ReportIn
from registry_service.agents.models import AgentRow
from registry_service.agents.report_writer import ReportWriter
from registry_service.auth.roles import Principal, Role
from registry_service.auth.service import create_token
from registry_service.db import migrate
from registry_service.db.engine import Database
from registry_service.errors import Forbidden, InvalidInput, Unauthorized, Unavailable
from registry_service.events.models import EventRow
from registry_service.events.service import event_json
from tests.registry.agents.support import BASE_MODEL, report, served

STALE_S = 90.0
ADMIN = Principal(token_id=0, name="test-admin", role=Role.ADMIN, tenant_id=None, tenant=None)


async def token(db: Database, name: str, role: Role = Role.AGENT) -> str:
    tenant = None if role is Role.AGENT else "acme"
    async with db.session() as session:
        created = await create_token(session, ADMIN, name=name, role=role, tenant=tenant)
    return created.secret


def status(agent_id: str, version: int = 1, base_model: str = BASE_MODEL) -> AgentStatus:
    return AgentStatus.model_validate(report(agent_id, entries=[served("bot", version)],
                                             base_model=base_model))


@pytest.fixture
def noted() -> list[tuple[str, list[str]]]:
    """The fleets the writer said a batch changed."""
    return []


@pytest.fixture
async def writer(db: Database, noted: list[tuple[str, list[str]]]
                 ) -> AsyncIterator[ReportWriter]:
    writer = ReportWriter(db, stale_after_s=STALE_S,
                          fleet_note=lambda base, agents: noted.append((base, agents)))
    await writer.start()
    yield writer
    await writer.stop()


async def stored_ids(db: Database) -> list[str]:
    async with db.session() as session:
        return list(await session.scalars(select(AgentRow.agent_id).order_by(AgentRow.agent_id)))


async def fleet_events(db: Database) -> list[FleetChanged]:
    async with db.session() as session:
        rows = await session.scalars(select(EventRow).where(EventRow.type == "fleet_changed")
                                     .order_by(EventRow.seq))
        events = [parse_event(json.dumps(event_json(row))) for row in rows]
    return [e for e in events if isinstance(e, FleetChanged)]


async def test_reports_sent_together_are_stored_in_one_transaction_each_answered(
        db: Database, writer: ReportWriter, noted: list[tuple[str, list[str]]]) -> None:
    ids = [f"agent-{i:02d}" for i in range(12)]
    secrets = [await token(db, f"t-{agent_id}") for agent_id in ids]
    # Submitted in reverse: the batch locks rows in agent-id order whatever the arrival.
    arrivals = reversed(list(zip(ids, secrets, strict=True)))
    answers = await asyncio.gather(*(writer.submit(ReportIn(secret, agent_id, status(agent_id)))
                                     for agent_id, secret in arrivals))
    assert [a.agent_id for a in answers] == list(reversed(ids))
    assert all(a.status.served[0].version == 1 and not a.stale for a in answers)
    assert writer.batches == 1
    assert await stored_ids(db) == ids
    # The twelve joins of one base model: one event with all of them, heard once.
    events = await fleet_events(db)
    assert [(e.agents, e.joined, e.left) for e in events] == [(ids, ids, [])]
    assert noted == [(BASE_MODEL, ids)]


async def test_a_refused_report_fails_alone_and_the_rest_of_its_batch_is_stored(
        db: Database, writer: ReportWriter) -> None:
    good, other = await token(db, "good"), await token(db, "other")
    reader = await token(db, "reader", Role.READER)
    await writer.submit(ReportIn(other, "agent-b", status("agent-b")))  # binds it to agent-b
    results = await asyncio.gather(
        writer.submit(ReportIn(good, "agent-a", status("agent-a"))),
        writer.submit(ReportIn("lp_unknown", "agent-c", status("agent-c"))),
        writer.submit(ReportIn(None, "agent-d", status("agent-d"))),
        writer.submit(ReportIn(reader, "agent-e", status("agent-e"))),
        writer.submit(ReportIn(other, "agent-f", status("agent-f"))),
        writer.submit(ReportIn(good, "agent-g", status("agent-x"))),
        return_exceptions=True)
    assert writer.batches == 2
    ok, unknown, missing, reader_refused, other_agent, mismatch = results
    assert not isinstance(ok, BaseException) and ok.agent_id == "agent-a"
    assert isinstance(unknown, Unauthorized) and unknown.code == "invalid_token"
    assert isinstance(missing, Unauthorized) and missing.code == "missing_token"
    assert isinstance(reader_refused, Forbidden) and reader_refused.code == "insufficient_role"
    assert isinstance(other_agent, Forbidden) and other_agent.code == "agent_id_forbidden"
    assert isinstance(mismatch, InvalidInput) and mismatch.code == "agent_id_mismatch"
    assert await stored_ids(db) == ["agent-a", "agent-b"]


async def test_a_batch_the_database_refuses_is_stored_one_report_at_a_time(
        db: Database, writer: ReportWriter) -> None:
    secrets = {agent_id: await token(db, agent_id) for agent_id in ("agent-a", "agent-b",
                                                                     "agent-c")}
    # Postgres stores no NUL in text: that report's row cannot be written, and its
    # batch's transaction fails as a whole. SQLite stores it.
    odd = status("agent-b", base_model="tiny\x00llama")
    results = await asyncio.gather(
        *(writer.submit(ReportIn(secrets[agent_id], agent_id,
                                 odd if agent_id == "agent-b" else status(agent_id)))
          for agent_id in secrets), return_exceptions=True)
    if db.is_postgres:
        assert isinstance(results[1], InvalidInput) and results[1].code == "invalid_character"
        assert await stored_ids(db) == ["agent-a", "agent-c"]
        assert writer.batches == 2  # the batch failed; a and c alone stored
    else:
        assert not any(isinstance(r, BaseException) for r in results)
        assert await stored_ids(db) == ["agent-a", "agent-b", "agent-c"]
        assert writer.batches == 1
    assert not any(isinstance(r, BaseException) for r in (results[0], results[2]))


async def test_stopping_stores_what_is_queued_then_refuses_reports(
        db: Database, writer: ReportWriter) -> None:
    secret = await token(db, "agent-a")
    pending = asyncio.ensure_future(writer.submit(ReportIn(secret, "agent-a",
                                                           status("agent-a"))))
    # Accepted: waiting or being written (or, on a fast machine, already answered).
    await eventually(lambda: writer.queued > 0 or pending.done(), what="the report accepted")
    await writer.stop()
    assert (await pending).agent_id == "agent-a"
    assert await stored_ids(db) == ["agent-a"]
    with pytest.raises(Unavailable) as refused:
        await writer.submit(ReportIn(secret, "agent-a", status("agent-a", 2)))
    assert refused.value.code == "shutting_down" and refused.value.retryable


async def test_a_full_queue_refuses_with_a_retryable_error(db: Database) -> None:
    writer = ReportWriter(db, stale_after_s=STALE_S, max_queued=2)
    await writer.start()
    try:
        secret = await token(db, "agent-a")
        results = await asyncio.gather(
            *(writer.submit(ReportIn(secret, "agent-a", status("agent-a", v)))
              for v in (1, 2, 3)), return_exceptions=True)
    finally:
        await writer.stop()
    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(refused) == 1 and getattr(refused[0], "code", None) == "reports_queue_full"
    assert getattr(refused[0], "retryable", False)


@pytest.fixture
async def pg_db(postgres: PostgresDatabase) -> AsyncIterator[Database]:
    """A migrated, empty Postgres database: a server that can drop a connection."""
    await reset_postgres(postgres)
    db = Database(postgres.async_url)
    await migrate.upgrade(db)
    yield db
    await db.close()


async def test_a_held_connection_that_was_lost_is_replaced_and_the_batch_stored(
        pg_db: Database) -> None:
    writer = ReportWriter(pg_db, stale_after_s=STALE_S)
    await writer.start()
    try:
        secret = await token(pg_db, "agent-a")
        await writer.submit(ReportIn(secret, "agent-a", status("agent-a", 1)))
        async with pg_db.session() as session:  # ends every other backend: the writer's too
            ended = await session.scalar(text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
        assert ended is not None and ended >= 1
        answer = await writer.submit(ReportIn(secret, "agent-a", status("agent-a", 2)))
    finally:
        await writer.stop()
    assert answer.status.served[0].version == 2
    assert writer.batches == 2
