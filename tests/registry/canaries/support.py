"""A registry with an adapter ``bot`` whose alias ``live`` is on version 1, and the
canary routes' calls, for the canary tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import upload_dir

ALIAS = "/v1/adapters/bot/aliases/live"
CANARY = f"{ALIAS}/canary"


async def bot(registry: RegistryHarness, tmp_path: Path, versions: int = 3) -> None:
    """``bot`` with ``versions`` versions and ``live`` on version 1."""
    await registry.create_adapter("bot")
    for seed in range(1, versions + 1):
        adapter = make_adapter(tmp_path / str(seed), seed=seed)
        response = await upload_dir(registry, "bot", adapter,
                                    aliases="live" if seed == 1 else "")
        assert response.status_code == 201, response.text


async def call(registry: RegistryHarness, method: str, url: str,
               headers: dict[str, str] | None = None, **kwargs: Any) -> tuple[int, Any]:
    response = await registry.client.request(method, url, headers=headers or
                                             registry.admin_headers, **kwargs)
    return response.status_code, response.json()


async def start_canary(registry: RegistryHarness, version: int = 2,
                       **body: Any) -> tuple[int, Any]:
    return await call(registry, "POST", CANARY, json={"version": version, **body})


async def history(registry: RegistryHarness) -> list[tuple[str, int | None, int | None]]:
    _, body = await call(registry, "GET", f"{ALIAS}/history")
    return [(m["action"], m["from_version"], m["to_version"]) for m in body["moves"]]


async def alias_events(registry: RegistryHarness) -> list[dict[str, Any]]:
    _, body = await call(registry, "GET", "/v1/events", params={"limit": 1000})
    return [e for e in body["events"] if e["type"] == "adapter_updated"]
