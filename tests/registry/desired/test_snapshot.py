"""The desired-state snapshot, read through its service function."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from loraplane.events import DesiredAdapter, DesiredAlias, DesiredState, RouteRule
from registry_service.auth.roles import Principal, Role
from registry_service.db.engine import Database
from registry_service.desired.service import desired_state
from tests.registry.seed import (
    ADMIN,
    AGENT,
    BASE,
    bot_desired,
    expected_ref,
    publish_two_of_three,
    seed_catalog,
)


async def test_desired_state_for_a_global_agent(db: Database) -> None:
    catalog = await seed_catalog(db)
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
                DesiredAlias(alias="live", revision=3, target=expected_ref(catalog.beta, 1))]),
            DesiredAdapter(tenant="acme", name="fresh", base_model=BASE, aliases=[]),
            bot_desired(catalog),
        ],
        routes=[
            RouteRule(kind="customer", key="c-1", adapter="support-bot", alias="live",
                      tenant="acme", base_model=BASE),
            RouteRule(kind="task", key="summarize", adapter="beta-bot", alias="canary",
                      tenant="beta", base_model=BASE),
        ],
        # The seed writes its rules directly, not through the routing service.
        route_revisions={"acme": 0, "beta": 0},
    )
    assert state.stream == "LORAPLANE"


async def test_desired_state_for_a_tenant_token_shows_its_tenant_only(db: Database) -> None:
    catalog = await seed_catalog(db)
    async with db.session() as session:
        state = await desired_state(session, catalog.acme_reader, base_model=BASE)
    async with db.session() as session:
        empty = await desired_state(session, ADMIN, base_model="unknown-model")

    assert [a.name for a in state.adapters] == ["fresh", "support-bot"]
    assert state.adapters[1] == bot_desired(catalog)
    assert [(r.kind, r.key) for r in state.routes] == [("customer", "c-1")]
    assert state.route_revisions == {"acme": 0}
    assert (state.stream_seq, state.event_seq) == (0, 0)
    assert empty.adapters == [] and empty.routes == []


@pytest.mark.parametrize("role", [Role.READER, Role.PUBLISHER, Role.ADMIN])
async def test_every_tenant_role_may_read_its_snapshot(db: Database, role: Role) -> None:
    catalog = await seed_catalog(db)
    principal = Principal(token_id=4, name="t", role=role,
                          tenant_id=catalog.beta.adapter.tenant_id, tenant="beta")
    async with db.session() as session:
        state = await desired_state(session, principal, base_model=BASE)
    assert [a.name for a in state.adapters] == ["beta-bot"]
