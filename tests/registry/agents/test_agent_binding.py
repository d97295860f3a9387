"""An agent token reports for one agent only, and a report's time is the registry's to cap."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from devharness.registry import RegistryHarness
from tests.registry.agents.support import fleet, post_status, report, served
from tests.registry.auth.principals import assert_error


async def agent_token(registry: RegistryHarness, **extra: Any) -> tuple[int, dict[str, str]]:
    response = await registry.client.post(
        "/v1/tokens", json={"name": "gpu-token", "role": "agent", **extra},
        headers=registry.admin_headers)
    assert response.status_code == 201, response.text
    return response.json()["id"], {"Authorization": f"Bearer {response.json()['secret']}"}


async def listed(registry: RegistryHarness, token_id: int) -> dict[str, Any]:
    response = await registry.client.get("/v1/tokens", headers=registry.admin_headers)
    assert response.status_code == 200, response.text
    [token] = [t for t in response.json()["tokens"] if t["id"] == token_id]
    return dict(token)


async def test_an_agent_token_is_bound_to_the_first_agent_it_reports_as(
    registry: RegistryHarness,
) -> None:
    token_id, agent = await agent_token(registry)
    assert (await listed(registry, token_id))["agent_id"] is None
    assert (await post_status(registry, report("gpu-1"), agent)).status_code == 200
    assert (await listed(registry, token_id))["agent_id"] == "gpu-1"
    # The same token cannot speak for another agent, new or known.
    assert_error(await post_status(registry, report("gpu-2"), agent), 403,
                 "agent_id_forbidden")
    assert (await post_status(registry, report("gpu-3"))).status_code == 200  # admin
    assert_error(await post_status(registry, report("gpu-3", entries=[served("bot", 9)]),
                                   agent), 403, "agent_id_forbidden")
    view = await fleet(registry)
    assert set(view) == {"gpu-1", "gpu-3"}
    assert view["gpu-3"]["status"]["served"] == []
    assert (await post_status(registry, report("gpu-1"), agent)).status_code == 200


async def test_an_agent_token_made_for_an_agent_reports_only_for_it(
    registry: RegistryHarness,
) -> None:
    token_id, agent = await agent_token(registry, agent_id="gpu-7")
    assert (await listed(registry, token_id))["agent_id"] == "gpu-7"
    assert_error(await post_status(registry, report("gpu-1"), agent), 403,
                 "agent_id_forbidden")
    assert (await post_status(registry, report("gpu-7"), agent)).status_code == 200
    assert set(await fleet(registry)) == {"gpu-7"}
    for body in ({"name": "x", "role": "admin", "agent_id": "gpu-1"},
                 {"name": "x", "role": "reader", "tenant": "acme", "agent_id": "gpu-1"}):
        response = await registry.client.post("/v1/tokens", json=body,
                                              headers=registry.admin_headers)
        assert_error(response, 400, "agent_id_needs_agent_role")
    response = await registry.client.post(
        "/v1/tokens", json={"name": "x", "role": "agent", "agent_id": "bad id!"},
        headers=registry.admin_headers)
    assert_error(response, 422, "invalid_request")


async def test_a_report_from_the_future_does_not_freeze_the_agent(
    registry: RegistryHarness,
) -> None:
    _id, agent = await agent_token(registry)
    before = datetime.now(UTC)
    future = report("gpu-1", entries=[served("bot", 1)], time=before + timedelta(days=365))
    assert (await post_status(registry, future, agent)).status_code == 200
    stored = (await fleet(registry))["gpu-1"]["status"]
    # Capped at the registry's clock when it arrived.
    assert datetime.fromisoformat(stored["time"]) <= datetime.now(UTC)
    assert datetime.fromisoformat(stored["time"]) >= before
    later = report("gpu-1", entries=[served("bot", 2)])
    assert (await post_status(registry, later, agent)).status_code == 200
    assert [s["version"] for s in (await fleet(registry))["gpu-1"]["status"]["served"]] == [2]
