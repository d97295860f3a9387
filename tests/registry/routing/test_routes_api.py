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
from tests.registry.routing.support import routable


async def route_events(registry: RegistryHarness) -> list[RouteChanged]:
    async with registry.ctx.db.session() as session:
        rows = await session.scalars(
            select(EventRow).where(EventRow.type == "route_changed").order_by(EventRow.seq))
        events = [event_of(row) for row in rows]
    assert all(isinstance(e, RouteChanged) for e in events)
    return [e for e in events if isinstance(e, RouteChanged)]


async def put(registry: RegistryHarness, path: str, body: dict[str, Any],
              headers: dict[str, str] | None = None) -> Any:
    """PUT a rule, which must succeed."""
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
    await routable(registry, "bot", tenant=OWN)
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
    await routable(registry, "bot", tenant=OWN)
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
    await routable(registry, "bot", tenant=OWN)
    await routable(registry, "helper", tenant=OTHER, base_model="other-model")
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
    await routable(registry, "bot", tenant=OWN)
    await routable(registry, "bot-two", tenant=OWN)
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


async def test_each_tenant_has_its_own_keys(registry: RegistryHarness) -> None:
    """Fails on the shared namespace: the second tenant's PUT of the same key was a 404,
    and whoever came first owned the key."""
    await routable(registry, "bot", tenant=OWN)
    await routable(registry, "helper", tenant=OTHER)
    who = await principals(registry)
    await put(registry, "customer/shared", {"adapter": "bot"}, who[f"publisher@{OWN}"])
    mine = await put(registry, "customer/shared", {"adapter": "helper"},
                     who[f"publisher@{OTHER}"])
    assert (mine["adapter"], mine["tenant"]) == ("helper", OTHER)
    assert await listed(registry, who[f"reader@{OWN}"]) == [("customer", "shared", "bot", "live")]
    assert await listed(registry, who[f"reader@{OTHER}"]) == [
        ("customer", "shared", "helper", "live")]
    assert await listed(registry, tenant=OTHER) == [("customer", "shared", "helper", "live")]
    assert await listed(registry, tenant="nobody") == []
    events = await route_events(registry)
    assert [(e.tenant, e.rule.tenant if e.rule else None) for e in events] == [
        (OWN, OWN), (OTHER, OTHER)]
    # Each tenant numbers its own rule changes.
    assert [e.route_revision for e in events] == [1, 1]
    # A tenant's token may not name another tenant, whatever it does.
    for method, body in (("PUT", {"adapter": "bot"}), ("DELETE", None), ("GET", None)):
        url = "/v1/routes" if method == "GET" else "/v1/routes/customer/shared"
        response = await registry.client.request(method, url, json=body,
                                                 params={"tenant": OTHER},
                                                 headers=who[f"admin@{OWN}"])
        assert_error(response, 403, "tenant_forbidden")
    # A global admin must say whose rule it deletes when two tenants have the key.
    response = await registry.client.delete("/v1/routes/customer/shared",
                                            headers=registry.admin_headers)
    assert_error(response, 400, "tenant_required")
    response = await registry.client.delete("/v1/routes/customer/shared",
                                            params={"tenant": OTHER},
                                            headers=registry.admin_headers)
    assert response.status_code == 204, response.text
    assert await listed(registry) == [("customer", "shared", "bot", "live")]
    # With one tenant left holding it, the key alone is enough.
    response = await registry.client.delete("/v1/routes/customer/shared",
                                            headers=registry.admin_headers)
    assert response.status_code == 204, response.text
    assert await listed(registry) == []
    # A global admin naming a tenant that is not the adapter's: the adapter is not there.
    response = await registry.client.put("/v1/routes/task/x", json={"adapter": "bot"},
                                         params={"tenant": OTHER},
                                         headers=registry.admin_headers)
    assert_error(response, 404, "adapter_not_found")


async def test_a_tenant_cannot_take_the_default_route(registry: RegistryHarness) -> None:
    """The issue's repro: a publisher of one tenant wrote ``default/!``, which sorted
    before every other default and took the requests of every tenant."""
    await routable(registry, "a-bot", tenant=OWN)
    await routable(registry, "g-bot", tenant=OTHER)
    who = await principals(registry)
    await put(registry, "default/default", {"adapter": "g-bot"}, who[f"publisher@{OTHER}"])
    for key in ("!", "!!", "zzz"):
        response = await registry.client.put(f"/v1/routes/default/{key}",
                                             json={"adapter": "a-bot"},
                                             headers=who[f"publisher@{OWN}"])
        assert_error(response, 422, "invalid_route_key")
    await put(registry, "default/default", {"adapter": "a-bot"}, who[f"publisher@{OWN}"])
    await put(registry, "default/default", {"adapter": "a-bot", "alias": "canary"},
              who[f"publisher@{OWN}"])
    assert await listed(registry, kind="default") == [
        ("default", "default", "a-bot", "canary"), ("default", "default", "g-bot", "live")]


async def test_a_rule_must_name_an_existing_alias(registry: RegistryHarness) -> None:
    await routable(registry, "a-bot", tenant=OWN)
    await registry.create_adapter("empty", tenant=OWN)
    cases = (("a-bot", "nothere"), ("empty", "live"))
    for adapter, alias in cases:
        response = await registry.client.put("/v1/routes/customer/c",
                                             json={"adapter": adapter, "alias": alias},
                                             headers=registry.admin_headers)
        assert_error(response, 404, "alias_not_found")
        assert response.json()["error"]["detail"] == {"adapter": adapter, "alias": alias}
    assert await route_events(registry) == []
    assert await listed(registry) == []


async def test_bad_input_is_refused_without_writing(registry: RegistryHarness) -> None:
    await routable(registry, "bot", tenant=OWN)
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
    await routable(registry, "bot", tenant=OWN)
    await put(registry, "customer/alice", {"adapter": "bot"})
    response = await registry.client.delete("/v1/adapters/bot", headers=registry.admin_headers)
    assert response.status_code == 204, response.text
    assert await listed(registry) == []
    response = await registry.client.put("/v1/routes/customer/alice", json={"adapter": "bot"},
                                         headers=registry.admin_headers)
    assert_error(response, 404, "adapter_not_found")


async def test_concurrent_puts_of_a_new_key_leave_one_rule(registry: RegistryHarness) -> None:
    await routable(registry, "bot", tenant=OWN)
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
    # Racing writers still number them without gaps, in the order they committed.
    assert [e.route_revision for e in events] == list(range(1, len(aliases) + 1))
