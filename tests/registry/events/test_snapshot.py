"""The desired-state snapshot and the audit log, read through their service functions."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from loraplane.events import DesiredAdapter, DesiredAlias, DesiredState, RouteRule
from registry_service.auth.roles import Principal, Role
from registry_service.db.engine import Database
from registry_service.desired.service import desired_state
from registry_service.events.audit import read_events
from registry_service.events.service import event_json
from tests.registry.events.support import (
    ADMIN,
    AGENT,
    BASE,
    bot_desired,
    expected_ref,
    publish_two_of_three,
    seed_fleet,
)


async def test_desired_state_for_a_global_agent(db: Database) -> None:
    fleet = await seed_fleet(db)
    rows = await publish_two_of_three(db)

    async with db.session() as session:
        state = await desired_state(session, AGENT, base_model=BASE)
        if db.is_postgres:
            # One snapshot for every read, so adapters and aliases agree.
            level = await session.scalar(text("SHOW transaction_isolation"))
            assert level == "repeatable read"

    assert state == DesiredState(
        base_model=BASE, stream_seq=9, event_seq=rows[-1].seq,
        adapters=[
            DesiredAdapter(tenant="beta", name="beta-bot", base_model=BASE, aliases=[
                DesiredAlias(alias="live", revision=3, target=expected_ref(fleet.beta, 1))]),
            DesiredAdapter(tenant="acme", name="fresh", base_model=BASE, aliases=[]),
            bot_desired(fleet),
        ],
        routes=[
            RouteRule(kind="customer", key="c-1", adapter="support-bot", alias="live",
                      tenant="acme", base_model=BASE),
            RouteRule(kind="task", key="summarize", adapter="beta-bot", alias="canary",
                      tenant="beta", base_model=BASE),
        ],
    )
    assert state.stream == "LORAPLANE"


async def test_desired_state_for_a_tenant_token_shows_its_tenant_only(db: Database) -> None:
    fleet = await seed_fleet(db)
    async with db.session() as session:
        state = await desired_state(session, fleet.acme_reader, base_model=BASE)
    async with db.session() as session:
        empty = await desired_state(session, ADMIN, base_model="unknown-model")

    assert [a.name for a in state.adapters] == ["fresh", "support-bot"]
    assert state.adapters[1] == bot_desired(fleet)
    assert [(r.kind, r.key) for r in state.routes] == [("customer", "c-1")]
    assert (state.stream_seq, state.event_seq) == (0, 0)
    assert empty.adapters == [] and empty.routes == []


async def test_audit_log_pages_in_seq_order_and_is_tenant_scoped(db: Database) -> None:
    fleet = await seed_fleet(db)
    rows = await publish_two_of_three(db)

    async with db.session() as session:
        first = await read_events(session, ADMIN, after=0, limit=2)
        second = await read_events(session, AGENT, after=first.next_after, limit=2)
        acme = await read_events(session, fleet.acme_reader, after=0, limit=100)
        done = await read_events(session, ADMIN, after=rows[-1].seq, limit=100)

    assert first.events == [event_json(row) for row in rows[:2]]
    assert first.next_after == rows[1].seq
    assert second.events == [event_json(rows[2])]
    assert second.next_after == rows[2].seq
    assert acme.events == [event_json(rows[0]), event_json(rows[2])]
    assert (done.events, done.next_after) == ([], rows[-1].seq)


@pytest.mark.parametrize("role", [Role.READER, Role.PUBLISHER, Role.ADMIN])
async def test_every_tenant_role_may_read_its_snapshot(db: Database, role: Role) -> None:
    fleet = await seed_fleet(db)
    principal = Principal(token_id=4, name="t", role=role,
                          tenant_id=fleet.beta.adapter.tenant_id, tenant="beta")
    async with db.session() as session:
        state = await desired_state(session, principal, base_model=BASE)
    assert [a.name for a in state.adapters] == ["beta-bot"]
