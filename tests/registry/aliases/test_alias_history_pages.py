"""Alias history pages: newest first by revision, ``next_cursor`` to the older moves, the
per-adapter merge of every alias's moves that the /ui timeline shows, and a rollback
that reads the history a page at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import upload_dir
from registry_service.adapters.lookup import get_visible_adapter
from registry_service.aliases import service
from registry_service.aliases.service import adapter_moves
from registry_service.auth.roles import Principal, Role

HISTORY = "/v1/adapters/bot/aliases/{alias}/history"


async def _bot(registry: RegistryHarness, tmp_path: Path, versions: int) -> None:
    await registry.create_adapter("bot")
    for seed in range(1, versions + 1):
        response = await upload_dir(registry, "bot", make_adapter(tmp_path / str(seed), seed=seed),
                                    aliases="")
        assert response.status_code == 201


async def _put(registry: RegistryHarness, alias: str, version: int) -> None:
    response = await registry.client.put(f"/v1/adapters/bot/aliases/{alias}",
                                         json={"version": version},
                                         headers=registry.admin_headers)
    assert response.status_code == 200, response.text


async def _history(registry: RegistryHarness, alias: str,
                   **params: Any) -> tuple[int, dict[str, Any]]:
    response = await registry.client.get(HISTORY.format(alias=alias), params=params,
                                         headers=registry.admin_headers)
    return response.status_code, response.json()


async def test_pages_walk_the_whole_history_once(registry: RegistryHarness,
                                                 tmp_path: Path) -> None:
    await _bot(registry, tmp_path, 3)
    for version in (1, 3, 2):
        await _put(registry, "live", version)
    deleted = await registry.client.delete("/v1/adapters/bot/aliases/live",
                                           headers=registry.admin_headers)
    assert deleted.status_code == 200
    await _put(registry, "live", 1)  # revisions 1..5: promote x3, delete, promote

    seen: list[tuple[int, str, int | None]] = []
    cursors: list[str | None] = []
    params: dict[str, Any] = {"limit": 2}
    while True:
        status, page = await _history(registry, "live", **params)
        assert status == 200, page
        assert len(page["moves"]) <= 2
        seen += [(m["revision"], m["action"], m["to_version"]) for m in page["moves"]]
        cursors.append(page["next_cursor"])
        if page["next_cursor"] is None:
            break
        params["cursor"] = page["next_cursor"]
    assert seen == [(5, "promote", 1), (4, "delete", None), (3, "promote", 2),
                    (2, "promote", 3), (1, "promote", 1)]
    assert cursors == ["4", "2", None]
    # Exactly one page: no cursor pointing at an empty page.
    status, whole = await _history(registry, "live", limit=5)
    assert status == 200 and len(whole["moves"]) == 5 and whole["next_cursor"] is None


async def test_history_errors(registry: RegistryHarness, tmp_path: Path) -> None:
    await _bot(registry, tmp_path, 1)
    await _put(registry, "live", 1)
    for bad in ("abc", "0", "-3", "99999999999"):
        status, body = await _history(registry, "live", cursor=bad)
        assert status == 400 and body["error"]["code"] == "invalid_cursor", body
    status, body = await _history(registry, "nope")
    assert status == 404 and body["error"]["code"] == "alias_not_found", body
    # Below the first revision there is nothing left, but the alias exists: an empty page.
    status, body = await _history(registry, "live", cursor="1")
    assert status == 200 and body["moves"] == [] and body["next_cursor"] is None


async def test_adapter_moves_merge_every_alias_newest_first(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await _bot(registry, tmp_path, 3)
    order = [("live", 1), ("canary", 2), ("live", 3), ("canary", 3), ("beta", 1), ("live", 2)]
    for alias, version in order:
        await _put(registry, alias, version)
    principal = Principal(token_id=0, name="test", role=Role.READER, tenant_id=None,
                          tenant=None)
    async with registry.ctx.db.session() as session:
        adapter = await get_visible_adapter(session, principal, "bot")
        latest = await adapter_moves(session, adapter, 4)
        everything = await adapter_moves(session, adapter, 100)
    newest_first = [(alias, version) for alias, version in reversed(order)]
    assert [(a, m.to_version) for a, m in latest] == newest_first[:4]
    assert [(a, m.to_version) for a, m in everything] == newest_first


async def _rollback(registry: RegistryHarness) -> tuple[int, int | None]:
    response = await registry.client.post("/v1/adapters/bot/aliases/live/rollback",
                                          headers=registry.admin_headers)
    return response.status_code, response.json().get("version")


async def test_rollback_walks_back_across_pages_of_moves(
    registry: RegistryHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of two moves: the last rollback has to read seven moves to find that
    nothing is left to undo, matching each rollback with the move it undid."""
    monkeypatch.setattr(service, "UNDO_SCAN_PAGE", 2)
    await _bot(registry, tmp_path, 3)
    for version in (1, 2, 3):
        await _put(registry, "live", version)
    assert await _rollback(registry) == (200, 2)
    assert await _rollback(registry) == (200, 1)
    await _put(registry, "live", 3)
    assert await _rollback(registry) == (200, 1)
    status, _ = await _rollback(registry)
    assert status == 409
    _, page = await _history(registry, "live")
    assert [m["action"] for m in page["moves"]] == [
        "rollback", "promote", "rollback", "rollback", "promote", "promote", "promote"]
