"""A small scene for the /ui tests: two tenants' adapters, versions, moves and agents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import upload_dir
from tests.registry.agents.support import post_status, report, served
from tests.registry.auth.principals import OTHER, OWN

__all__ = ["OTHER", "OWN", "promote", "push", "report_serving", "rollback", "scene"]


async def push(registry: RegistryHarness, name: str, folder: Path, seed: int, *,
               aliases: str | None = "live", notes: str | None = None,
               headers: dict[str, str] | None = None, **shape: Any) -> dict[str, Any]:
    """Upload a made adapter; ``shape`` goes to ``make_adapter`` (rank, targets...)."""
    response = await upload_dir(registry, name, make_adapter(folder, seed=seed, **shape),
                                aliases=aliases, notes=notes, headers=headers)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


async def promote(registry: RegistryHarness, name: str, alias: str, version: int,
                  headers: dict[str, str] | None = None) -> None:
    response = await registry.client.put(f"/v1/adapters/{name}/aliases/{alias}",
                                         json={"version": version},
                                         headers=headers or registry.admin_headers)
    assert response.status_code == 200, response.text


async def rollback(registry: RegistryHarness, name: str, alias: str,
                   headers: dict[str, str] | None = None) -> None:
    response = await registry.client.post(f"/v1/adapters/{name}/aliases/{alias}/rollback",
                                          headers=headers or registry.admin_headers)
    assert response.status_code == 200, response.text


async def report_serving(registry: RegistryHarness, agent_id: str, *entries: Any,
                         failures: tuple[Any, ...] = ()) -> None:
    response = await post_status(registry, report(agent_id, entries=entries,
                                                  failures=failures))
    assert response.status_code == 200, response.text


async def scene(registry: RegistryHarness, tmp_path: Path) -> None:
    """``bot`` of OWN with v1 (live), ``rival`` of OTHER with v1 (live); one agent
    serving both."""
    await registry.create_adapter("bot", tenant=OWN)
    await registry.create_adapter("rival", tenant=OTHER)
    await push(registry, "bot", tmp_path / "bot1", 1, aliases="live", notes="first cut")
    await push(registry, "rival", tmp_path / "rival1", 2, aliases="live")
    await report_serving(registry, "gpu-a", served("bot", 1), served("rival", 1))
