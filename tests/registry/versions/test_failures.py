"""Uploads while a dependency is down, and concurrent uploads."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from devharness.adapters import make_adapter
from devharness.openai_client import RETRY_OVER_HTTP
from devharness.registry import RegistryHarness
from devharness.uploads import count_rows, stream_events, upload_dir
from devharness.waiting import eventually


async def test_upload_while_s3_is_down_answers_503_and_leaves_no_row(
    pg_registry: RegistryHarness, tmp_path: Path
) -> None:
    registry = pg_registry
    assert registry.s3 is not None
    await registry.create_adapter("bot")
    registry.s3.stop()
    try:
        response = await upload_dir(registry, "bot", make_adapter(tmp_path / "a", seed=1))
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "blob_store_unavailable"
        assert response.headers.get("retry-after")
        assert await count_rows(registry) == (0, 1)  # adapter_created only
    finally:
        registry.s3.start()
    again = await upload_dir(registry, "bot", make_adapter(tmp_path / "a", seed=1))
    assert again.status_code == 201, again.text


async def _wait_for_messages(
    url: str, count: int, timeout_s: float = 20
) -> list[dict[str, Any]]:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            messages = await stream_events(url)
        except Exception:
            messages = []
        if len(messages) >= count or asyncio.get_running_loop().time() > deadline:
            return messages
        await asyncio.sleep(0.2)


async def test_upload_while_nats_is_down_is_published_once_nats_is_back(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await registry.create_adapter("bot")
    registry.nats.stop()
    response = await upload_dir(registry, "bot", make_adapter(tmp_path / "a", seed=1))
    assert response.status_code == 201, response.text
    assert await count_rows(registry) == (1, 3)  # adapter_created (audit) + the two to publish
    relay, seen = registry.ctx.relay, registry.ctx.relay.passes

    async def retried_and_failed() -> bool:
        # A whole pass since the commit, and a failed one: the rows waited out NATS.
        errors = registry.ctx.metrics.registry.get_sample_value(
            "loraplane_registry_relay_errors_total")
        return relay.passes >= seen + 2 and (errors or 0) >= 1

    await eventually(retried_and_failed, timeout_s=20, interval_s=0.05, retrying=RETRY_OVER_HTTP,
                     what="a failed relay pass")
    registry.nats.start()
    messages = await _wait_for_messages(registry.nats.url, 2)
    assert [m["type"] for m in messages] == ["version_published", "adapter_updated"]
    assert messages[1]["version"] == 1 and messages[1]["alias"] == "live"


async def test_concurrent_uploads_get_distinct_version_numbers(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await registry.create_adapter("bot")
    # Six at once from one token: above the default of uploads in flight per token.
    registry.ctx.settings.max_uploads_per_token = 6
    folders = [make_adapter(tmp_path / str(i), seed=100 + i) for i in range(6)]
    responses = await asyncio.gather(*(upload_dir(registry, "bot", f) for f in folders))
    assert [r.status_code for r in responses] == [201] * 6, [r.text for r in responses]
    assert sorted(r.json()["version"] for r in responses) == [1, 2, 3, 4, 5, 6]
    live = (await registry.client.get("/v1/adapters/bot", headers=registry.admin_headers)).json()
    assert live["aliases"][0]["revision"] == 6


async def test_concurrent_identical_uploads_make_one_version(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await registry.create_adapter("bot")
    folder = make_adapter(tmp_path / "same", seed=5)
    responses = await asyncio.gather(*(upload_dir(registry, "bot", folder) for _ in range(4)))
    assert sorted(r.status_code for r in responses) == [200, 200, 200, 201]
    assert {r.json()["version"] for r in responses} == {1}
    assert (await count_rows(registry))[0] == 1
