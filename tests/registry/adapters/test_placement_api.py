"""Placement: the ``replicas`` setting on create and update, validated; carried in the
desired state with the live agents; and the fleet view's placed / hot / tiers."""

from __future__ import annotations

from typing import Any

from devharness.registry import RegistryHarness
from loraplane.events import AgentStatus, TierEntry
from loraplane.placement import owners
from tests.registry.agents.support import BASE_MODEL, age_agent, post_status, report


async def _create(registry: RegistryHarness, body: dict[str, Any]) -> Any:
    return await registry.client.post("/v1/adapters", json={
        "base_model": BASE_MODEL, "tenant": "acme", **body}, headers=registry.admin_headers)


async def test_replicas_on_create_and_update_are_validated(registry: RegistryHarness) -> None:
    made = await _create(registry, {"name": "bot", "replicas": 2})
    assert made.status_code == 201 and made.json()["replicas"] == 2
    plain = await _create(registry, {"name": "plain"})
    assert plain.json()["replicas"] is None
    for bad in (0, -1, 1001):
        refused = await _create(registry, {"name": f"x{bad + 10}", "replicas": bad})
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["code"] == "invalid_replicas"
    wrong_type = await _create(registry, {"name": "y", "replicas": "many"})
    assert wrong_type.json()["error"]["code"] == "invalid_request"
    patch = registry.client.patch
    changed = await patch("/v1/adapters/bot", json={"replicas": 1},
                          headers=registry.admin_headers)
    assert changed.status_code == 200 and changed.json()["replicas"] == 1
    kept = await patch("/v1/adapters/bot", json={"description": "d"},
                       headers=registry.admin_headers)
    assert (kept.json()["replicas"], kept.json()["description"]) == (1, "d")
    refused = await patch("/v1/adapters/bot", json={"replicas": 0},
                          headers=registry.admin_headers)
    assert refused.json()["error"]["code"] == "invalid_replicas"
    cleared = await patch("/v1/adapters/bot", json={"replicas": None},
                          headers=registry.admin_headers)
    assert cleared.json()["replicas"] is None
    reader = await registry.token("reader", "acme")
    denied = await patch("/v1/adapters/bot", json={"replicas": 3}, headers=reader)
    assert denied.status_code == 403


async def test_a_placement_change_is_an_event(registry: RegistryHarness) -> None:
    await _create(registry, {"name": "bot"})
    for replicas in (2, 2, None):  # the second PATCH changes nothing: no event
        await registry.client.patch("/v1/adapters/bot", json={"replicas": replicas},
                                    headers=registry.admin_headers)
    events = (await registry.client.get("/v1/events", headers=registry.admin_headers)).json()
    placed = [e for e in events["events"] if e["type"] == "placement_changed"]
    assert [(e["adapter"], e["base_model"], e["replicas"]) for e in placed] == [
        ("bot", BASE_MODEL, 2), ("bot", BASE_MODEL, None)]


async def test_desired_state_carries_replicas_and_the_live_fleet(
        registry: RegistryHarness) -> None:
    await _create(registry, {"name": "bot", "replicas": 1})
    await _create(registry, {"name": "plain"})
    for agent in ("a1", "a2", "a3"):
        await post_status(registry, report(agent))
    await post_status(registry, report("other-model", base_model="other"))
    await age_agent(registry, "a3", 3600)
    desired = (await registry.client.get("/v1/desired", params={"base_model": BASE_MODEL},
                                         headers=registry.admin_headers)).json()
    assert desired["agents"] == ["a1", "a2"]
    assert {a["name"]: a["replicas"] for a in desired["adapters"]} == {"bot": 1, "plain": None}


async def test_the_fleet_view_shows_placed_hot_and_tiers(registry: RegistryHarness) -> None:
    await _create(registry, {"name": "bot", "replicas": 1})
    owner = owners(["a1", "a2"], "bot", 1)[0]
    other = "a2" if owner == "a1" else "a1"
    for agent, tier in ((owner, "hot"), (other, "warm")):
        body = report(agent)
        status = AgentStatus.model_validate(body).model_copy(update={
            "tiers": [TierEntry(adapter="bot", version=1, tier=tier, owned=agent == owner)],
            "loaded": ["bot@1"] if tier == "hot" else []})
        await post_status(registry, status.model_dump(mode="json"))
    rollout = (await registry.client.get("/v1/adapters/bot/rollout",
                                         headers=registry.admin_headers)).json()
    assert rollout["replicas"] == 1
    assert rollout["placed"] == [owner] and rollout["hot"] == [owner]
    tiers = {t["agent_id"]: (t["tier"], t["owned"]) for t in rollout["tiers"]}
    assert tiers == {owner: ("hot", True), other: ("warm", False)}
