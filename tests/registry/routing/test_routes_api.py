"""Routing rules over the REST API: roles, tenants, events and bad input."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import func, select

from devharness.registry import RegistryHarness
from loraplane.events import RouteChanged
from registry_service.events.models import EventRow
from registry_service.events.service import event_of
from registry_service.routing.models import RouteRuleRow
from tests.registry.auth.principals import (
    OTHER,
    OWN,
    PUBLISHER_WRITE,
    Expected,
    assert_error,
    assert_outcome,
    or_admin,
    principals,
)


async def route_events(registry: RegistryHarness) -> list[RouteChanged]:
    async with registry.ctx.db.session() as session:
        rows = await session.scalars(
            select(EventRow).where(EventRow.type == "route_changed").order_by(EventRow.seq))
        events = [event_of(row) for row in rows]
    assert all(isinstance(e, RouteChanged) for e in events)
    return [e for e in events if isinstance(e, RouteChanged)]


async def put(registry: RegistryHarness, path: str, body: dict[str, Any],
              headers: dict[str, str] | None = None) -> Any:
    response = await registry.client.put(f"/v1/routes/{path}", json=body,
                                         headers=or_admin(registry, headers))
    assert response.status_code == 200, response.text
    return response.json()


async def listed(registry: RegistryHarness, headers: dict[str, str] | None = None,
                 **params: str) -> list[tuple[str, str, str, str]]:
    response = await registry.client.get("/v1/routes", params=params,
                                         headers=or_admin(registry, headers))
    assert response.status_code == 200, response.text
    return [(r["kind"], r["key"], r["adapter"], r["alias"]) for r in response.json()["routes"]]


async def test_put_route_matrix_of_roles_and_tenants(registry: RegistryHarness) -> None:
    await registry.create_adapter("bot", tenant=OWN)
    who = await principals(registry)
    created = []
    for i, (name, expected) in enumerate(PUBLISHER_WRITE.items()):
        before = len(await route_events(registry))
        response = await registry.client.put(f"/v1/routes/customer/c{i}",
                                             json={"adapter": "bot"}, headers=who[name])
        # Another tenant's adapter does not exist as far as the caller can tell.
        code = "adapter_not_found" if expected.status == 404 else expected.code
        assert_outcome(response, Expected(expected.status, code), name)
        written = 1 if expected.status == 200 else 0
        assert len(await route_events(registry)) == before + written, name
        if written:
            created.append(("customer", f"c{i}", "bot", "live"))
            body = response.json()
            assert body.pop("updated_at")
            assert body == {"kind": "customer", "key": f"c{i}", "adapter": "bot",
                            "alias": "live", "tenant": OWN, "base_model": "tiny-llama"}
    assert len(created) == 3
    assert await listed(registry) == sorted(created)


async def test_delete_route_matrix_of_roles_and_tenants(registry: RegistryHarness) -> None:
    await registry.create_adapter("bot", tenant=OWN)
    who = await principals(registry)
    for i in range(len(PUBLISHER_WRITE)):
        await put(registry, f"task/t{i}", {"adapter": "bot"})
    for i, (name, expected) in enumerate(PUBLISHER_WRITE.items()):
        before = len(await route_events(registry))
        response = await registry.client.delete(f"/v1/routes/task/t{i}", headers=who[name])
        status = 204 if expected.status == 200 else expected.status
        code = "route_not_found" if status == 404 else expected.code
        assert_outcome(response, Expected(status, code), name)
        assert len(await route_events(registry)) == before + (1 if status == 204 else 0), name
    remaining = {key for _, key, _, _ in await listed(registry)}
    deleted = {f"t{i}" for i, e in enumerate(PUBLISHER_WRITE.values()) if e.status == 200}
    assert remaining == {f"t{i}" for i in range(len(PUBLISHER_WRITE))} - deleted


async def test_listing_is_scoped_to_the_tokens_tenant(registry: RegistryHarness) -> None:
    await registry.create_adapter("bot", tenant=OWN)
    await registry.create_adapter("helper", tenant=OTHER, base_model="other-model")
    await put(registry, "customer/alice", {"adapter": "bot", "alias": "canary"})
    await put(registry, "task/summarize", {"adapter": "bot"})
    await put(registry, "default/default", {"adapter": "helper"})
    who = await principals(registry)
    everything = [("customer", "alice", "bot", "canary"), ("default", "default", "helper", "live"),
                  ("task", "summarize", "bot", "live")]
    assert await listed(registry) == everything
    assert await listed(registry, who["agent"]) == everything
    for role in ("reader", "publisher", "admin"):
        assert await listed(registry, who[f"{role}@{OWN}"]) == [everything[0], everything[2]]
        assert await listed(registry, who[f"{role}@{OTHER}"]) == [everything[1]]
    assert await listed(registry, kind="task") == [everything[2]]
    assert await listed(registry, who[f"reader@{OTHER}"], kind="task") == []
    for name, code in (("no-token", "missing_token"), ("invalid-token", "invalid_token")):
        assert_error(await registry.client.get("/v1/routes", headers=who[name]), 401, code)
    assert_error(await registry.client.get("/v1/routes", params={"kind": "nope"},
                                           headers=registry.admin_headers), 422)


async def test_every_change_writes_exactly_one_event(registry: RegistryHarness) -> None:
    await registry.create_adapter("bot", tenant=OWN)
    await registry.create_adapter("bot-two", tenant=OWN)
    await put(registry, "customer/alice", {"adapter": "bot"})
    await put(registry, "customer/alice", {"adapter": "bot"})  # no change, no event
    await put(registry, "customer/alice", {"adapter": "bot", "alias": "canary"})
    await put(registry, "customer/alice", {"adapter": "bot-two", "alias": "canary"})
    response = await registry.client.delete("/v1/routes/customer/alice",
                                            headers=registry.admin_headers)
    assert response.status_code == 204, response.text
    events = await route_events(registry)
    assert [(e.adapter, e.kind, e.key, e.rule.alias if e.rule else None) for e in events] == [
        ("bot", "customer", "alice", "live"), ("bot", "customer", "alice", "canary"),
        ("bot-two", "customer", "alice", "canary"), ("bot-two", "customer", "alice", None)]
    for event in events:
        assert event.tenant == OWN
        if event.rule is not None:
            assert (event.rule.tenant, event.rule.adapter) == (event.tenant, event.adapter)
    first = events[0].rule
    assert first is not None
    assert (first.tenant, first.base_model, first.adapter) == (OWN, "tiny-llama", "bot")
    # The events are readable through the API too, in the same order.
    page = (await registry.client.get("/v1/events", headers=registry.admin_headers)).json()
    assert [e["seq"] for e in page["events"] if e["type"] == "route_changed"] == \
        [e.seq for e in events]


async def test_replacing_another_tenants_rule_needs_rights_on_both(
    registry: RegistryHarness,
) -> None:
    await registry.create_adapter("bot", tenant=OWN)
    await registry.create_adapter("helper", tenant=OTHER)
    await put(registry, "customer/shared", {"adapter": "bot"})
    who = await principals(registry)
    before = len(await route_events(registry))
    for name in (f"publisher@{OTHER}", f"admin@{OTHER}"):
        response = await registry.client.put("/v1/routes/customer/shared",
                                             json={"adapter": "helper"}, headers=who[name])
        assert_error(response, 404, "route_not_found")
    assert len(await route_events(registry)) == before
    assert await listed(registry) == [("customer", "shared", "bot", "live")]
    replaced = await put(registry, "customer/shared", {"adapter": "helper"})
    assert (replaced["adapter"], replaced["tenant"]) == ("helper", OTHER)
    events = await route_events(registry)
    assert len(events) == before + 1 and events[-1].tenant == OTHER
    # Now it is the other tenant's rule: the first tenant can neither see nor touch it.
    assert await listed(registry, who[f"admin@{OWN}"]) == []
    response = await registry.client.delete("/v1/routes/customer/shared",
                                            headers=who[f"publisher@{OWN}"])
    assert_error(response, 404, "route_not_found")
    response = await registry.client.delete("/v1/routes/customer/shared",
                                            headers=who[f"publisher@{OTHER}"])
    assert response.status_code == 204, response.text


async def test_bad_input_is_refused_without_writing(registry: RegistryHarness) -> None:
    await registry.create_adapter("bot", tenant=OWN)
    cases: list[tuple[str, str, Any, int, str]] = [
        ("PUT", "/v1/routes/tenant/x", {"adapter": "bot"}, 422, "invalid_request"),
        ("PUT", "/v1/routes/customer/x", {"adapter": "bot", "alias": "Not A Slug"}, 422,
         "invalid_alias"),
        ("PUT", "/v1/routes/customer/x", {"adapter": "bot", "alias": "7"}, 422, "invalid_alias"),
        ("PUT", "/v1/routes/customer/x", {"alias": "live"}, 422, "invalid_request"),
        ("PUT", "/v1/routes/customer/x", {"adapter": "bot", "extra": 1}, 422, "invalid_request"),
        ("PUT", "/v1/routes/customer/x", ["bot"], 422, "invalid_request"),
        ("PUT", "/v1/routes/customer/x", {"adapter": "nope"}, 404, "adapter_not_found"),
        ("PUT", "/v1/routes/customer/has%20space", {"adapter": "bot"}, 422,
         "invalid_route_key"),
        ("PUT", "/v1/routes/customer/" + "k" * 256, {"adapter": "bot"}, 422,
         "invalid_route_key"),
        ("DELETE", "/v1/routes/customer/missing", None, 404, "route_not_found"),
        ("DELETE", "/v1/routes/everyone/x", None, 422, "invalid_request"),
    ]
    for method, url, body, status, code in cases:
        response = await registry.client.request(method, url, json=body,
                                                 headers=registry.admin_headers)
        try:
            assert_error(response, status, code)
        except AssertionError as exc:
            raise AssertionError(f"{method} {url} {body}: {exc}") from exc
    assert await route_events(registry) == []
    assert await listed(registry) == []


async def test_a_deleted_adapter_cannot_be_routed_to(registry: RegistryHarness) -> None:
    await registry.create_adapter("bot", tenant=OWN)
    await put(registry, "customer/alice", {"adapter": "bot"})
    response = await registry.client.delete("/v1/adapters/bot", headers=registry.admin_headers)
    assert response.status_code == 204, response.text
    assert await listed(registry) == []
    response = await registry.client.put("/v1/routes/customer/alice", json={"adapter": "bot"},
                                         headers=registry.admin_headers)
    assert_error(response, 404, "adapter_not_found")


async def test_concurrent_puts_of_a_new_key_leave_one_rule(registry: RegistryHarness) -> None:
    await registry.create_adapter("bot", tenant=OWN)
    aliases = [f"a{i}" for i in range(6)]
    responses = await asyncio.gather(*(
        registry.client.put("/v1/routes/task/race", json={"adapter": "bot", "alias": alias},
                            headers=registry.admin_headers)
        for alias in aliases))
    assert [r.status_code for r in responses] == [200] * len(aliases), \
        [r.text for r in responses]
    async with registry.ctx.db.session() as session:
        rules = await session.scalar(select(func.count()).select_from(RouteRuleRow))
    assert rules == 1
    routes = await listed(registry)
    assert len(routes) == 1 and routes[0][3] in aliases
    events = await route_events(registry)
    # Every PUT changed the alias, so each wrote one event; the last one is what stands.
    assert len(events) == len(aliases)
    assert events[-1].rule is not None and events[-1].rule.alias == routes[0][3]
