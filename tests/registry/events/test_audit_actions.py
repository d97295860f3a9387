"""Every change an operator makes shows up in the audit log (``GET /v1/events``), and
what agents do not need (adapter creation, tokens) is never published to them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import select

from devharness.registry import RegistryHarness
from devharness.waiting import eventually
from registry_service.events.models import EventRow
from tests.registry.routing.support import routable


async def _events(registry: RegistryHarness, headers: dict[str, str] | None = None
                  ) -> list[dict[str, Any]]:
    response = await registry.client.get("/v1/events?limit=1000",
                                         headers=headers or registry.admin_headers)
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["events"]
    return events


async def test_each_action_is_in_the_audit_log(registry: RegistryHarness) -> None:
    headers = registry.admin_headers
    await routable(registry, "bot", tenant="acme", aliases=("live",))
    created = await registry.client.post(
        "/v1/tokens", json={"name": "ci", "role": "publisher", "tenant": "acme"},
        headers=headers)
    assert created.status_code == 201, created.text
    token_id = created.json()["id"]
    revoked = await registry.client.delete(f"/v1/tokens/{token_id}", headers=headers)
    assert revoked.status_code == 204, revoked.text
    put = await registry.client.put("/v1/routes/customer/c-1", json={"adapter": "bot"},
                                    headers=headers)
    assert put.status_code == 200, put.text
    gone = await registry.client.delete("/v1/routes/customer/c-1", headers=headers)
    assert gone.status_code == 204, gone.text
    deleted = await registry.client.delete("/v1/adapters/bot", headers=headers)
    assert deleted.status_code == 204, deleted.text

    seen = [(e["type"], e.get("adapter"), e.get("token_id"))
            for e in await _events(registry)]
    assert seen == [
        ("adapter_created", "bot", None),
        ("token_created", "", token_id),
        ("token_revoked", "", token_id),
        ("route_changed", "bot", None),
        ("route_changed", "bot", None),
        ("adapter_updated", "bot", None),  # its alias removed
        ("adapter_deleted", "bot", None),
    ], seen
    # A tenant's reader sees its tenant's entries, tokens of its tenant included.
    reader = await registry.token("reader", "acme")
    assert "token_created" in {e["type"] for e in await _events(registry, reader)}


async def test_audit_only_entries_are_never_published_to_agents(
    registry: RegistryHarness
) -> None:
    await routable(registry, "bot", tenant="acme")
    await registry.token("publisher", "acme")
    route = await registry.client.put("/v1/routes/task/t-1", json={"adapter": "bot"},
                                      headers=registry.admin_headers)
    assert route.status_code == 200

    async def published() -> dict[str, bool]:
        async with registry.ctx.db.session() as session:
            rows = await session.scalars(select(EventRow).order_by(EventRow.seq))
            return {row.type: row.stream_seq is not None for row in rows}

    # The relay publishes the route change; once it has, it has passed over the others.
    await eventually(lambda: _route_published(published))
    assert await published() == {"adapter_created": False, "token_created": False,
                                 "route_changed": True}


async def _route_published(published: Callable[[], Awaitable[dict[str, bool]]]) -> bool:
    return (await published()).get("route_changed", False)
