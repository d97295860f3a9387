"""Issue 35 on the fleet API: tiers are tenant-filtered, an agent id is bound to one
token, and a report older than the held one is refused without marking the agent seen."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from devharness.registry import RegistryHarness
from loraplane.events import TierEntry
from tests.registry.agents.support import fleet, post_status, report, served
from tests.registry.auth.principals import OTHER, OWN, assert_error


async def agent_token(registry: RegistryHarness, **extra: Any) -> tuple[int, dict[str, str]]:
    response = await registry.client.post(
        "/v1/tokens", json={"name": "gpu-token", "role": "agent", **extra},
        headers=registry.admin_headers)
    assert response.status_code == 201, response.text
    return response.json()["id"], {"Authorization": f"Bearer {response.json()['secret']}"}


async def revoke(registry: RegistryHarness, token_id: int) -> None:
    response = await registry.client.delete(f"/v1/tokens/{token_id}",
                                            headers=registry.admin_headers)
    assert response.status_code == 204, response.text


async def release(registry: RegistryHarness, agent_id: str,
                  headers: dict[str, str] | None = None) -> Any:
    return await registry.client.delete(f"/v1/agents/{agent_id}/binding",
                                        headers=headers or registry.admin_headers)


async def test_a_tenant_reader_sees_only_its_own_tiers(registry: RegistryHarness) -> None:
    await registry.create_adapter("bot", tenant=OWN)
    await registry.create_adapter("helper", tenant=OTHER)
    body = report("gpu-1", entries=[served("bot", 1)])
    body["tiers"] = [TierEntry(adapter="bot", version=1, tier="hot", owned=True)
                     .model_dump(mode="json"),
                     TierEntry(adapter="helper", version=3, tier="warm")
                     .model_dump(mode="json")]
    assert (await post_status(registry, body)).status_code == 200
    everyone = await fleet(registry)
    assert sorted(t["adapter"] for t in everyone["gpu-1"]["status"]["tiers"]) == \
        ["bot", "helper"]
    own = await fleet(registry, await registry.token("reader", OWN))
    assert [t["adapter"] for t in own["gpu-1"]["status"]["tiers"]] == ["bot"]
    other = await fleet(registry, await registry.token("reader", OTHER))
    assert [t["adapter"] for t in other["gpu-1"]["status"]["tiers"]] == ["helper"]


async def test_an_agent_id_is_bound_to_one_token(registry: RegistryHarness) -> None:
    first_id, first = await agent_token(registry)
    assert (await post_status(registry, report("gpu-1", entries=[served("bot", 1)]),
                              first)).status_code == 200
    # Another unbound agent token may not take gpu-1 over, nor replace its status.
    _second_id, second = await agent_token(registry)
    hijack = report("gpu-1", entries=[served("evil", 9)])
    assert_error(await post_status(registry, hijack, second), 403, "agent_id_bound")
    assert [s["adapter"] for s in (await fleet(registry))["gpu-1"]["status"]["served"]] == \
        ["bot"]
    # The refused token stayed unbound: it may still bind a free id.
    assert (await post_status(registry, report("gpu-2"), second)).status_code == 200
    # A token made for an id a live token holds is refused.
    response = await registry.client.post(
        "/v1/tokens", json={"name": "x", "role": "agent", "agent_id": "gpu-1"},
        headers=registry.admin_headers)
    assert_error(response, 409, "agent_id_taken")
    # Revoking the holder does not free the id: no other token may grab it meanwhile.
    await revoke(registry, first_id)
    _third_id, third = await agent_token(registry)
    assert_error(await post_status(registry, report("gpu-1"), third), 403, "agent_id_bound")


async def test_a_global_admin_frees_a_revoked_tokens_binding(
    registry: RegistryHarness,
) -> None:
    first_id, first = await agent_token(registry)
    assert (await post_status(registry, report("gpu-1"), first)).status_code == 200
    assert_error(await release(registry, "gpu-1"), 409, "agent_token_live")
    assert_error(await release(registry, "gpu-1", await registry.token("admin", OWN)), 403,
                 "insufficient_role")
    assert_error(await release(registry, "gpu-1", first), 403, "insufficient_role")
    await revoke(registry, first_id)
    assert (await release(registry, "gpu-1")).status_code == 204
    assert_error(await release(registry, "gpu-1"), 404, "agent_binding_not_found")
    _new_id, new = await agent_token(registry)
    assert (await post_status(registry, report("gpu-1"), new)).status_code == 200
    events = (await registry.client.get("/v1/events", headers=registry.admin_headers)).json()
    [freed] = [e for e in events["events"] if e["type"] == "agent_binding_released"]
    assert (freed["agent_id"], freed["token_id"]) == ("gpu-1", first_id)


async def test_a_token_made_for_an_id_takes_it_from_a_revoked_token(
    registry: RegistryHarness,
) -> None:
    first_id, first = await agent_token(registry, agent_id="gpu-1")
    assert (await post_status(registry, report("gpu-1"), first)).status_code == 200
    await revoke(registry, first_id)
    _second_id, second = await agent_token(registry, agent_id="gpu-1")
    assert (await post_status(registry, report("gpu-1"), second)).status_code == 200


async def test_a_report_older_than_the_held_one_is_refused_and_not_seen(
    registry: RegistryHarness,
) -> None:
    _id, agent = await agent_token(registry)
    now = datetime.now(UTC)
    fresh = report("gpu-1", entries=[served("bot", 2)], time=now - timedelta(seconds=5))
    assert (await post_status(registry, fresh, agent)).status_code == 200
    seen = (await fleet(registry))["gpu-1"]
    behind = report("gpu-1", entries=[served("bot", 1)], time=now - timedelta(hours=1))
    response = await post_status(registry, behind, agent)
    assert_error(response, 409, "stale_report")
    assert response.json()["error"]["detail"]["agent_id"] == "gpu-1"
    after = (await fleet(registry))["gpu-1"]
    assert after["last_seen_at"] == seen["last_seen_at"]
    assert [s["version"] for s in after["status"]["served"]] == [2]
