"""The JSON endpoints the /ui page reads: auth, tenant scoping, bad input, content."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devharness.registry import RegistryHarness
from devharness.services import NatsService
from registry_service.ui.routes import STATIC
from tests.conftest import _registry
from tests.registry.agents.support import age_agent, served
from tests.registry.auth.principals import assert_error
from tests.registry.ui.support import (
    OTHER,
    OWN,
    promote,
    push,
    report_serving,
    rollback,
    scene,
)

ENDPOINTS = ("/ui/api/session", "/ui/api/fleet", "/ui/api/adapters/bot/timeline",
             "/ui/api/adapters/bot/versions/1", "/ui/api/adapters/bot/diff?base=1&head=1",
             "/ui/api/canaries", "/ui/api/stream")


async def test_every_endpoint_needs_a_registry_token(registry: RegistryHarness,
                                                     tmp_path: Path) -> None:
    await scene(registry, tmp_path)
    inference = await registry.token("inference", OWN)
    for path in ENDPOINTS:
        assert_error(await registry.client.get(path), 401, "missing_token")
        assert_error(await registry.client.get(
            path, headers={"Authorization": "Bearer lp_not-a-token"}), 401, "invalid_token")
        assert_error(await registry.client.get(path, headers=inference), 403,
                     "insufficient_role")


async def test_session_says_who_the_token_is(registry: RegistryHarness) -> None:
    reader = await registry.token("reader", OWN)
    response = await registry.client.get("/ui/api/session", headers=reader)
    assert response.status_code == 200, response.text
    assert response.json() == {"name": f"reader-{OWN}", "role": "reader", "tenant": OWN,
                               "can_move_aliases": False}
    admin = await registry.client.get("/ui/api/session", headers=registry.admin_headers)
    assert (admin.json()["tenant"], admin.json()["can_move_aliases"]) == (None, True)
    publisher = await registry.token("publisher", OWN)
    response = await registry.client.get("/ui/api/session", headers=publisher)
    assert response.json()["can_move_aliases"] is True


async def test_timeline_has_uploads_and_every_move(registry: RegistryHarness,
                                                   tmp_path: Path) -> None:
    await scene(registry, tmp_path)
    publisher = await registry.token("publisher", OWN)
    await push(registry, "bot", tmp_path / "bot2", 3, aliases="", headers=publisher)
    await promote(registry, "bot", "live", 2, headers=publisher)
    await promote(registry, "bot", "canary", 2)
    await rollback(registry, "bot", "live", headers=publisher)
    response = await registry.client.get("/ui/api/adapters/bot/timeline",
                                         headers=await registry.token("reader", OWN))
    assert response.status_code == 200, response.text
    body = response.json()
    assert [(a["alias"], a["version"]) for a in body["adapter"]["aliases"]] == \
        [("canary", 2), ("live", 1)]
    rows = [(e["kind"], e["version"], e["alias"], e["action"], e["from_version"], e["actor"])
            for e in body["entries"]]
    assert rows == [
        ("move", 1, "live", "rollback", 2, f"publisher-{OWN}"),
        ("move", 2, "canary", "promote", None, "bootstrap-admin"),
        ("move", 2, "live", "promote", 1, f"publisher-{OWN}"),
        ("version", 2, None, None, None, f"publisher-{OWN}"),
        ("move", 1, "live", "publish", None, "bootstrap-admin"),
        ("version", 1, None, None, None, "bootstrap-admin"),
    ]
    assert body["entries"][-1]["notes"] == "first cut"
    assert body["truncated"] is False
    limited = await registry.client.get("/ui/api/adapters/bot/timeline?limit=2",
                                        headers=registry.admin_headers)
    assert [e["action"] for e in limited.json()["entries"]] == ["rollback", "promote"]
    assert limited.json()["truncated"] is True


async def test_timeline_of_another_tenant_is_not_found(registry: RegistryHarness,
                                                       tmp_path: Path) -> None:
    await scene(registry, tmp_path)
    other = await registry.token("admin", OTHER)
    assert_error(await registry.client.get("/ui/api/adapters/bot/timeline", headers=other),
                 404, "adapter_not_found")
    assert_error(await registry.client.get("/ui/api/adapters/nope/timeline",
                                           headers=registry.admin_headers),
                 404, "adapter_not_found")


async def test_timeline_refuses_bad_limits(registry: RegistryHarness, tmp_path: Path) -> None:
    await scene(registry, tmp_path)
    for bad in ("0", "1001", "-1", "ten"):
        response = await registry.client.get(f"/ui/api/adapters/bot/timeline?limit={bad}",
                                             headers=registry.admin_headers)
        assert_error(response, 422, "invalid_request")
        assert response.json()["error"]["detail"]["errors"][0]["loc"] == ["query", "limit"]


async def test_fleet_shows_the_tenants_own_adapters_only(registry: RegistryHarness,
                                                         tmp_path: Path) -> None:
    await scene(registry, tmp_path)
    await push(registry, "bot", tmp_path / "bot2", 3, aliases="canary")
    failure = served("bot", 2, "canary", "failed", reason="rank 8 > max_lora_rank 4",
                     code="rank_too_large")
    await report_serving(registry, "gpu-b", served("bot", 1), failures=(failure,))
    own = await registry.client.get("/ui/api/fleet",
                                    headers=await registry.token("reader", OWN))
    assert own.status_code == 200, own.text
    [bot] = own.json()["adapters"]
    assert (bot["adapter"], bot["tenant"]) == ("bot", OWN)
    canary, live = bot["aliases"]
    assert [(e["agent_id"], e["version"]) for e in live["serving"]] == \
        [("gpu-a", 1), ("gpu-b", 1)]
    assert (canary["version"], canary["pending"], canary["converged"]) == (2, ["gpu-a"], False)
    assert [(e["agent_id"], e["reason"], e["code"]) for e in canary["failed"]] == \
        [("gpu-b", "rank 8 > max_lora_rank 4", "rank_too_large")]
    other = await registry.client.get("/ui/api/fleet",
                                      headers=await registry.token("reader", OTHER))
    assert [r["adapter"] for r in other.json()["adapters"]] == ["rival"]
    assert "bot" not in other.text
    every = await registry.client.get("/ui/api/fleet", headers=registry.admin_headers)
    assert [r["adapter"] for r in every.json()["adapters"]] == ["bot", "rival"]


async def test_deleted_adapters_leave_the_fleet(registry: RegistryHarness,
                                                tmp_path: Path) -> None:
    await scene(registry, tmp_path)
    response = await registry.client.delete("/v1/adapters/bot", headers=registry.admin_headers)
    assert response.status_code == 204, response.text
    fleet = await registry.client.get("/ui/api/fleet", headers=registry.admin_headers)
    assert [r["adapter"] for r in fleet.json()["adapters"]] == ["rival"]


async def test_the_page_and_its_files_come_from_the_package(registry: RegistryHarness) -> None:
    for path in ("/", "/dashboard"):
        response = await registry.client.get(path)
        assert (response.status_code, response.headers["location"]) == (307, "/ui")
    page = await registry.client.get("/ui")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for name in sorted(p.name for p in STATIC.iterdir()):
        served_file = await registry.client.get(f"/ui/static/{name}")
        assert served_file.status_code == 200, name
        # Nothing the page loads or calls is elsewhere: no absolute or protocol-relative URL.
        assert not re.search(r"https?:|[\"'(]//", served_file.text), name
    assert_error(await registry.client.get("/ui/static/missing.js"), 404, "not_found")


async def test_the_fleet_follows_the_registrys_staleness_window(
        request: pytest.FixtureRequest, backend: str, tmp_path: Path, nats: NatsService) -> None:
    """An agent silent for 30 s shows stale in the fleet of a registry whose window is
    20 s (by the default, 90 s, it would still be fresh)."""
    async for registry in _registry(request, backend, tmp_path, nats, agent_stale_after_s=20.0):
        await scene(registry, tmp_path)
        await report_serving(registry, "gpu-b", served("bot", 1))
        await age_agent(registry, "gpu-b", 30)
        fleet = await registry.client.get("/ui/api/fleet", headers=registry.admin_headers)
        assert fleet.status_code == 200, fleet.text
        [bot] = [a for a in fleet.json()["adapters"] if a["adapter"] == "bot"]
        [live] = bot["aliases"]
        assert [(e["agent_id"], e["stale"]) for e in live["serving"]] == \
            [("gpu-a", False), ("gpu-b", True)]
