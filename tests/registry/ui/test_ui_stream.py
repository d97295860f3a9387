"""``/ui/api/stream``: the page's live feed, over real HTTP (uvicorn)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from devharness.http_registry import Served, serve_http
from devharness.services import NatsService
from tests.registry.agents.support import served
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
