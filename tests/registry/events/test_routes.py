"""/v1/events through the running app, with its own relay and NATS."""

from __future__ import annotations

import json
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.js.client import JetStreamContext
from sqlalchemy import func, select

from devharness.registry import RegistryHarness
from devharness.waiting import eventually
from loraplane.events import parse_event
from registry_service.events.models import EventRow
from registry_service.events.service import event_json
from tests.registry.events.support import record, stream_messages
from tests.registry.routing.support import routable
from tests.registry.seed import BASE


async def _published(registry: RegistryHarness) -> bool:
    async with registry.ctx.db.session() as session:
        pending = await session.scalar(
            select(func.count()).select_from(EventRow).where(EventRow.published_at.is_(None)))
    return pending == 0


async def test_events_pages_and_tenant_scope(registry: RegistryHarness) -> None:
    acme_rows = await record(registry.ctx.db, 2, tenant="acme", adapter="a")
    beta_rows = await record(registry.ctx.db, 1, tenant="beta", adapter="b")
    acme = await registry.token("reader", tenant="acme")
    headers = registry.admin_headers

    first = await _get_events(registry, headers, after=0, limit=2)
    assert [e["event_id"] for e in first["events"]] == [r.event_id for r in acme_rows]
    second = await _get_events(registry, headers, after=first["next_after"], limit=2)
    # The reader token's creation is in the audit log too, after the recorded rows.
    assert [e["event_id"] for e in second["events"]][:1] == [beta_rows[0].event_id]
    assert [e["type"] for e in second["events"]][1:] == ["token_created"]
    assert second["events"][0] == event_json(beta_rows[0])
    assert parse_event(json.dumps(second["events"][0])).adapter == "b"
    empty = await _get_events(registry, headers, after=second["next_after"])
    assert empty == {"events": [], "next_after": second["next_after"]}

    scoped = await _get_events(registry, acme, after=0)
    assert [(e["tenant"], e["type"]) for e in scoped["events"]] == [
        ("acme", acme_rows[0].type), ("acme", acme_rows[1].type), ("acme", "token_created")]

    for limit in (0, 1001):
        refused = await registry.client.get("/v1/events", params={"limit": limit},
                                            headers=headers)
        assert refused.status_code == 422, limit
    assert (await registry.client.get("/v1/events")).status_code == 401


async def test_an_api_change_reaches_the_stream_and_the_audit_log(
    registry: RegistryHarness,
) -> None:
    await routable(registry, "routed", tenant="acme", base_model=BASE)
    put = await registry.client.put("/v1/routes/customer/c-42", json={"adapter": "routed"},
                                    headers=registry.admin_headers)
    assert put.status_code == 200, put.text
    await eventually(lambda: _published(registry), what="route event published")

    log = await _get_events(registry, registry.admin_headers, after=0)
    [changed] = [e for e in log["events"] if e["type"] == "route_changed"]
    client = NatsClient()
    await client.connect(registry.nats.url)
    try:
        messages = await stream_messages(JetStreamContext(client))
    finally:
        await client.close()
    [msg] = [m for m in messages if m.data and parse_event(m.data).type == "route_changed"]
    assert msg.subject == "loraplane.events.acme.routed"
    assert msg.data is not None and parse_event(msg.data) == parse_event(json.dumps(changed))


async def _get_events(registry: RegistryHarness, headers: dict[str, str], *, after: int,
                      limit: int | None = None) -> dict[str, Any]:
    params = {"after": after} if limit is None else {"after": after, "limit": limit}
    response = await registry.client.get("/v1/events", params=params, headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body
