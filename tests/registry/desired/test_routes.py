"""/v1/desired through the running app, with its own relay and NATS."""

from __future__ import annotations

from sqlalchemy import func, select

from devharness.registry import RegistryHarness
from devharness.waiting import eventually
from loraplane.events import DesiredState, RouteRule
from registry_service.events.models import EventRow
from tests.registry.events.support import all_published, record
from tests.registry.seed import BASE, bot_desired, seed_catalog


async def test_desired_snapshot_for_agents_and_tenants(registry: RegistryHarness) -> None:
    catalog = await seed_catalog(registry.ctx.db)
    rows = await record(registry.ctx.db, 3)
    await eventually(lambda: all_published(registry.ctx.db),
                     what="events published by the app's relay")
    agent = await registry.token("agent")
    acme = await registry.token("reader", tenant="acme")

    response = await registry.client.get("/v1/desired", params={"base_model": BASE},
                                         headers=agent)
    assert response.status_code == 200, response.text
    state = DesiredState.model_validate(response.json())
    async with registry.ctx.db.session() as session:
        last = await session.scalar(select(func.max(EventRow.stream_seq)))
    assert state.stream_seq == last
    assert state.event_seq >= rows[-1].seq
    assert [a.name for a in state.adapters] == ["beta-bot", "fresh", "support-bot"]
    assert state.adapters[2] == bot_desired(catalog)
    assert [r.adapter for r in state.routes] == ["support-bot", "beta-bot"]

    one = await registry.client.get("/v1/desired",
                                    params={"base_model": BASE, "adapter": "support-bot"},
                                    headers=agent)
    only = DesiredState.model_validate(one.json())
    assert only.adapters == [bot_desired(catalog)]
    assert {r.adapter for r in only.routes} == {"support-bot"}
    gone = await registry.client.get("/v1/desired", params={"base_model": BASE, "adapter": "nope"},
                                     headers=agent)
    assert DesiredState.model_validate(gone.json()).adapters == []

    scoped = await registry.client.get("/v1/desired", params={"base_model": BASE},
                                       headers=acme)
    assert scoped.status_code == 200, scoped.text
    body = DesiredState.model_validate(scoped.json())
    assert [a.name for a in body.adapters] == ["fresh", "support-bot"]
    assert body.routes == [RouteRule(kind="customer", key="c-1", adapter="support-bot",
                                     alias="live", tenant="acme", base_model=BASE)]


async def test_desired_refusals(registry: RegistryHarness) -> None:
    missing = await registry.client.get("/v1/desired", headers=registry.admin_headers)
    assert missing.status_code == 422
    assert missing.json()["error"]["code"] == "invalid_request"
    anonymous = await registry.client.get("/v1/desired", params={"base_model": BASE})
    assert anonymous.status_code == 401
