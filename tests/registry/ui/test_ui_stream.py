"""``/ui/api/stream``: the page's live feed, over real HTTP (uvicorn)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from devharness.http_registry import Served, serve_http
from devharness.services import NatsService
from tests.registry.agents.support import served
from tests.registry.canaries.support import ANALYSIS, CANARY, call, report, side
from tests.registry.ui.sse import live
from tests.registry.ui.support import OTHER, OWN, promote, push, report_serving, scene


@pytest.fixture
async def http_registry(tmp_path: Path, nats: NatsService) -> AsyncIterator[Served]:
    async with serve_http("embedded", tmp_path / "data", nats) as server:
        yield server


async def test_stream_sends_changes_and_the_fleet(http_registry: Served,
                                                  tmp_path: Path) -> None:
    registry = http_registry.harness
    await scene(registry, tmp_path)
    reader = await registry.token("reader", OWN)
    async with live(http_registry.url, reader) as frames:
        _, first = await frames.next("changes")
        _, fleet = await frames.next("fleet")
        assert [r["adapter"] for r in fleet["adapters"]] == ["bot"]
        await push(registry, "bot", tmp_path / "bot2", 3, aliases="")
        await promote(registry, "bot", "live", 2)
        # The version and the move may come in one look or two; wait for both.
        _, after = await frames.next("changes")
        while after["events"] < first["events"] + 2:
            _, after = await frames.next("changes")
        assert after["seq"] > first["seq"]
        await report_serving(registry, "gpu-a", served("bot", 2))
        _, fleet = await frames.next("fleet")
        while fleet["adapters"][0]["aliases"][0]["serving"][0]["version"] != 2:
            _, fleet = await frames.next("fleet")
        assert fleet["adapters"][0]["aliases"][0]["converged"] is True


async def test_stream_of_a_tenant_ignores_the_other_tenants_changes(
        http_registry: Served, tmp_path: Path) -> None:
    registry = http_registry.harness
    await scene(registry, tmp_path)
    async with live(http_registry.url, await registry.token("reader", OTHER)) as frames:
        _, first = await frames.next("changes")
        await push(registry, "bot", tmp_path / "bot2", 3)   # OWN's adapter
        await push(registry, "rival", tmp_path / "rival2", 4, aliases="")
        # The first change this stream reports is its own tenant's upload: OWN's push,
        # made before it, moved nothing here.
        _, after = await frames.next("changes")
        assert after["events"] == first["events"] + 1


async def test_a_revoked_token_ends_the_stream(http_registry: Served, tmp_path: Path) -> None:
    registry = http_registry.harness
    created = await registry.client.post("/v1/tokens", json={"name": "page", "role": "reader",
                                                             "tenant": OWN},
                                         headers=registry.admin_headers)
    token = created.json()
    async with live(http_registry.url,
                    {"Authorization": f"Bearer {token['secret']}"}) as frames:
        await frames.next("changes")
        response = await registry.client.delete(f"/v1/tokens/{token['id']}",
                                                headers=registry.admin_headers)
        assert response.status_code == 204, response.text
        _, error = await frames.next("error")
        assert error["code"] == "invalid_token"


async def test_stream_sends_the_tenants_running_canaries_as_they_change(
        http_registry: Served, tmp_path: Path) -> None:
    """A ``canaries`` event at the first look and whenever the running canaries change:
    one starts, its step's traffic grows, it pauses, it ends. Another tenant's stream
    sees none of it."""
    registry = http_registry.harness
    await scene(registry, tmp_path)
    await push(registry, "bot", tmp_path / "bot2", 3, aliases="")
    async with live(http_registry.url, await registry.token("reader", OWN)) as own, \
            live(http_registry.url, await registry.token("reader", OTHER)) as other:
        _, first = await own.next("canaries")
        assert first == {"canaries": []}
        assert await other.next("canaries") == ("canaries", {"canaries": []})
        status, started = await call(registry, "POST", CANARY, json={
            "version": 2, "steps": [10, 50], "step_seconds": 600, "analysis": ANALYSIS})
        assert status == 201, started
        _, shown = await own.next("canaries")
        [canary] = shown["canaries"]
        assert (canary["id"], canary["state"], canary["weight"]) == (started["id"],
                                                                     "progressing", 10)
        await report(registry, "gpu-1", side(canary["id"], "stable", 40),
                     side(canary["id"], "canary", 20))
        _, shown = await own.next("canaries")
        requests = next(c for c in shown["canaries"][0]["live_checks"]
                        if c["metric"] == "requests")
        assert (requests["stable"], requests["canary"], requests["verdict"]) == (40, 20, "pass")
        assert (await call(registry, "POST", f"{CANARY}/pause"))[0] == 200
        _, shown = await own.next("canaries")
        assert shown["canaries"][0]["state"] == "paused"
        assert (await call(registry, "POST", f"{CANARY}/abort"))[0] == 200
        assert await own.next("canaries") == ("canaries", {"canaries": []})
        # The other tenant's stream was sent no canary in all that: its next change is
        # its own tenant's upload, with no canaries event before it.
        await push(registry, "rival", tmp_path / "rival2", 4, aliases="")
        event, _ = await other.next("canaries", "changes")
        assert event == "changes"
