"""Inference tokens: made like any token, refused by every registry call, and listed by
hash for agents at /v1/agents/credentials. Creating or revoking one tells the agents
through the outbox (a credentials_changed event on NATS)."""

from __future__ import annotations

import hashlib
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.js.client import JetStreamContext
from sqlalchemy import select

from devharness.registry import RegistryHarness
from devharness.waiting import eventually
from loraplane.events import CredentialsChanged, parse_event
from registry_service.events.models import EventRow
from registry_service.events.service import event_of
from tests.registry.auth.principals import OTHER, OWN, assert_error, principals
from tests.registry.events.support import all_published, stream_messages


async def create(registry: RegistryHarness, body: dict[str, Any],
                 headers: dict[str, str] | None = None) -> Any:
    return await registry.client.post("/v1/tokens", json=body,
                                      headers=headers or registry.admin_headers)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def credentials(registry: RegistryHarness, headers: dict[str, str]) -> Any:
    response = await registry.client.get("/v1/agents/credentials", headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["credentials"]


async def changes(registry: RegistryHarness) -> list[CredentialsChanged]:
    async with registry.ctx.db.session() as session:
        rows = await session.scalars(select(EventRow).where(
            EventRow.type == "credentials_changed").order_by(EventRow.seq))
        events = [event_of(row) for row in rows]
    return [e for e in events if isinstance(e, CredentialsChanged)]


async def test_an_inference_token_is_tenant_scoped_and_made_by_admins(
        registry: RegistryHarness) -> None:
    who = await principals(registry)
    assert_error(await create(registry, {"name": "c", "role": "inference"}), 400,
                 "tenant_required")
    mine = await create(registry, {"name": "c", "role": "inference", "tenant": OWN},
                        who[f"admin@{OWN}"])
    assert mine.status_code == 201, mine.text
    assert (mine.json()["role"], mine.json()["tenant"]) == ("inference", OWN)
    for name in (f"publisher@{OWN}", "agent"):
        refused = await create(registry, {"name": "c", "role": "inference", "tenant": OWN},
                               who[name])
        assert_error(refused, 403, "insufficient_role")
    refused = await create(registry, {"name": "c", "role": "inference", "tenant": OTHER},
                           who[f"admin@{OWN}"])
    assert_error(refused, 403, "tenant_forbidden")


async def test_an_inference_token_is_refused_by_every_registry_call(
        registry: RegistryHarness) -> None:
    await registry.create_adapter("bot", tenant=OWN)
    created = await create(registry, {"name": "c", "role": "inference", "tenant": OWN})
    headers = bearer(created.json()["secret"])
    calls = [("GET", "/v1/adapters"), ("GET", "/v1/adapters/bot"),
             ("GET", "/v1/adapters/bot/versions"), ("GET", "/v1/routes"),
             ("GET", "/v1/events"), ("GET", "/v1/desired?base_model=tiny-llama"),
             ("GET", "/v1/agents"), ("GET", "/v1/agents/credentials"),
             ("GET", "/v1/tokens"), ("PUT", "/v1/routes/customer/c"),
             ("POST", "/v1/adapters"), ("DELETE", "/v1/adapters/bot")]
    for method, url in calls:
        response = await registry.client.request(method, url, headers=headers,
                                                 json={"adapter": "bot"})
        try:
            assert_error(response, 403, "insufficient_role")
        except AssertionError as exc:
            raise AssertionError(f"{method} {url}: {exc}") from exc


async def test_agents_read_live_inference_hashes_and_every_change_is_an_event(
        registry: RegistryHarness) -> None:
    who = await principals(registry)  # other roles' tokens: never listed, no event
    assert await changes(registry) == []
    secrets = {}
    for tenant in (OWN, OTHER):
        response = await create(registry, {"name": f"c-{tenant}", "role": "inference",
                                           "tenant": tenant})
        secrets[tenant] = (response.json()["id"], response.json()["secret"])
    expected = [{"token_hash": hashlib.sha256(secret.encode()).hexdigest(), "tenant": tenant}
                for tenant, (_id, secret) in secrets.items()]
    for headers in (who["agent"], registry.admin_headers):
        assert await credentials(registry, headers) == expected
    for name in (f"admin@{OWN}", f"publisher@{OWN}", f"reader@{OTHER}"):
        response = await registry.client.get("/v1/agents/credentials", headers=who[name])
        assert_error(response, 403, "insufficient_role")
    revoked = await registry.client.delete(f"/v1/tokens/{secrets[OWN][0]}",
                                           headers=registry.admin_headers)
    assert revoked.status_code == 204, revoked.text
    assert await credentials(registry, who["agent"]) == expected[1:]
    assert [e.tenant for e in await changes(registry)] == [OWN, OTHER, OWN]
    # The events reach the stream, on the tenant's own subject, and carry no secret.
    await eventually(lambda: all_published(registry.ctx.db), what="events published")
    client = NatsClient()
    await client.connect(registry.nats.url)
    try:
        messages = await stream_messages(JetStreamContext(client))
    finally:
        await client.close()
    sent = [m for m in messages if m.data and parse_event(m.data).type == "credentials_changed"]
    assert [m.subject for m in sent] == [f"loraplane.events.{t}" for t in (OWN, OTHER, OWN)]
    for message in sent:
        assert message.data is not None
        assert not any(secret.encode() in message.data for _id, secret in secrets.values())
        assert not any(e["token_hash"].encode() in message.data for e in expected)
