"""``GET /v1/adapters/{name}/rollout``: which agents serve which version, who failed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import upload_dir
from tests.registry.agents.support import age_agent, post_status, report, served
from tests.registry.auth.principals import OTHER, OWN, assert_error, principals


async def rollout(registry: RegistryHarness, name: str = "bot",
                  headers: dict[str, str] | None = None) -> Any:
    return await registry.client.get(f"/v1/adapters/{name}/rollout",
                                     headers=registry.admin_headers if headers is None
                                     else headers)


def agents_of(entries: list[dict[str, Any]]) -> list[tuple[str, int, str]]:
    return sorted((e["agent_id"], e["version"], e["state"]) for e in entries)


async def _publish_two_versions(registry: RegistryHarness, tmp_path: Path) -> None:
    await registry.create_adapter("bot", tenant=OWN)
    first = await upload_dir(registry, "bot", make_adapter(tmp_path / "v1", seed=1))
    assert first.status_code == 201, first.text
    second = await upload_dir(registry, "bot", make_adapter(tmp_path / "v2", seed=2),
                              aliases="canary")
    assert second.status_code == 201, second.text


async def _report_fleet(registry: RegistryHarness) -> None:
    """Five agents' reports, sent by the global admin (an agent token speaks for one)."""
    reports = [
        report("gpu-a", entries=[served("bot", 1), served("bot", 2, "canary")]),
        report("gpu-b", entries=[served("bot", 1)],
               failures=[served("bot", 2, "canary", "failed",
                                reason="rank 8 > max_lora_rank 4", code="rank_too_large")]),
        # No alias named: it counts for every alias at that version.
        report("gpu-c", entries=[served("bot", 1, None), served("bot", 9, "old")]),
        report("gpu-d", base_model="other-model",
               failures=[served("bot", 1, "live", "failed", reason="base model mismatch")]),
        report("gpu-e", entries=[served("bot", 1, "live", "draining")]),
    ]
    for body in reports:
        response = await post_status(registry, body)
        assert response.status_code == 200, response.text
    await age_agent(registry, "gpu-e", 3600)


async def test_rollout_per_alias(registry: RegistryHarness, tmp_path: Path) -> None:
    await _publish_two_versions(registry, tmp_path)
    await _report_fleet(registry)
    response = await rollout(registry)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["adapter"], body["tenant"], body["base_model"], body["deleted"]) == \
        ("bot", OWN, "tiny-llama", False)
    assert body["agents"] == 3  # gpu-a, b, c; gpu-d has another base model, gpu-e is stale
    canary, live = body["aliases"]  # by alias name
    assert (live["alias"], live["version"], canary["alias"], canary["version"]) == \
        ("live", 1, "canary", 2)
    assert agents_of(live["serving"]) == [("gpu-a", 1, "serving"), ("gpu-b", 1, "serving"),
                                          ("gpu-c", 1, "serving"), ("gpu-e", 1, "draining")]
    assert [(e["agent_id"], e["stale"]) for e in live["serving"] if e["stale"]] == \
        [("gpu-e", True)]
    assert agents_of(live["failed"]) == [("gpu-d", 1, "failed")]
    assert (live["pending"], live["converged"]) == ([], True)
    assert agents_of(canary["serving"]) == [("gpu-a", 2, "serving")]
    [failure] = canary["failed"]
    assert (failure["agent_id"], failure["reason"], failure["code"]) == \
        ("gpu-b", "rank 8 > max_lora_rank 4", "rank_too_large")
    assert (canary["pending"], canary["converged"]) == (["gpu-c"], False)
    assert [(e["agent_id"], e["alias"], e["version"]) for e in body["unaliased"]] == \
        [("gpu-c", "old", 9)]


async def test_a_removed_alias_shows_while_agents_still_report_it(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await _publish_two_versions(registry, tmp_path)
    await _report_fleet(registry)
    response = await registry.client.delete("/v1/adapters/bot/aliases/canary",
                                            headers=registry.admin_headers)
    assert response.status_code == 200, response.text
    canary = (await rollout(registry)).json()["aliases"][0]
    assert (canary["alias"], canary["version"], canary["converged"]) == ("canary", None, False)
    assert agents_of(canary["serving"]) == [("gpu-a", 2, "serving")]
    # Once gpu-a reports it dropped canary, the alias is gone from the rollout.
    for agent_id in ("gpu-a", "gpu-b"):
        response = await post_status(registry, report(agent_id, entries=[served("bot", 1)]))
        assert response.status_code == 200, response.text
    assert [a["alias"] for a in (await rollout(registry)).json()["aliases"]] == ["live"]


async def test_rollout_visibility(registry: RegistryHarness, tmp_path: Path) -> None:
    await registry.create_adapter("bot", tenant=OWN)
    who = await principals(registry)
    for name in ("global-admin", "agent", f"reader@{OWN}", f"publisher@{OWN}", f"admin@{OWN}"):
        response = await rollout(registry, headers=who[name])
        assert response.status_code == 200, f"{name}: {response.text}"
        assert response.json()["aliases"] == []
    for name in (f"reader@{OTHER}", f"admin@{OTHER}"):
        assert_error(await rollout(registry, headers=who[name]), 404, "adapter_not_found")
    assert_error(await rollout(registry, "nope"), 404, "adapter_not_found")
    assert_error(await rollout(registry, headers=who["no-token"]), 401, "missing_token")
    response = await registry.client.get("/v1/adapters/bot/rollout",
                                         params={"stale_after_s": "0"},
                                         headers=registry.admin_headers)
    assert_error(response, 422, "invalid_request")
    # A deleted adapter keeps its rollout: operators watch the fleet drain it.
    response = await registry.client.delete("/v1/adapters/bot", headers=registry.admin_headers)
    assert response.status_code == 204, response.text
    assert (await rollout(registry)).json()["deleted"] is True


async def test_with_no_agent_a_rollout_is_not_converged(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await _publish_two_versions(registry, tmp_path)
    body = (await rollout(registry)).json()
    assert body["agents"] == 0
    for alias in body["aliases"]:
        assert (alias["converged"], alias["reason"]) == (False, "no agents"), alias
