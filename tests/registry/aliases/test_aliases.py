"""Alias moves: promote, rollback, delete, history, and conditional moves."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import upload_dir


async def _three_versions(registry: RegistryHarness, tmp_path: Path) -> None:
    await registry.create_adapter("bot")
    for seed in (1, 2, 3):
        response = await upload_dir(registry, "bot", make_adapter(tmp_path / str(seed), seed=seed),
                                    aliases="")
        assert response.status_code == 201


async def _put(registry: RegistryHarness, version: int, alias: str = "live",
               expected: int | None = None) -> tuple[int, dict[str, Any]]:
    body: dict[str, object] = {"version": version}
    if expected is not None:
        body["expected_revision"] = expected
    response = await registry.client.put(f"/v1/adapters/bot/aliases/{alias}", json=body,
                                         headers=registry.admin_headers)
    return response.status_code, response.json()


async def test_promote_rollback_and_history(registry: RegistryHarness, tmp_path: Path) -> None:
    await _three_versions(registry, tmp_path)
    assert (await _put(registry, 1))[0] == 200
    status, state = await _put(registry, 3)
    assert status == 200 and state["previous_version"] == 1 and state["revision"] == 2
    status, same = await _put(registry, 3)
    assert status == 200 and same["changed"] is False and same["revision"] == 2
    rolled = await registry.client.post("/v1/adapters/bot/aliases/live/rollback",
                                        headers=registry.admin_headers)
    assert rolled.status_code == 200 and rolled.json()["version"] == 1
    history = (await registry.client.get("/v1/adapters/bot/aliases/live/history",
                                         headers=registry.admin_headers)).json()
    assert [(m["revision"], m["action"], m["from_version"], m["to_version"])
            for m in history["moves"]] == [(3, "rollback", 3, 1), (2, "promote", 1, 3),
                                           (1, "promote", None, 1)]
    events = (await registry.client.get("/v1/events", headers=registry.admin_headers)).json()
    moves = [(e["revision"], e["action"], e["version"], e["previous_version"])
             for e in events["events"] if e["type"] == "adapter_updated"]
    assert moves == [(1, "promote", 1, None), (2, "promote", 3, 1), (3, "rollback", 1, 3)]


async def test_delete_alias_then_recreate_keeps_counting_revisions(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await _three_versions(registry, tmp_path)
    await _put(registry, 2)
    deleted = await registry.client.delete("/v1/adapters/bot/aliases/live",
                                           headers=registry.admin_headers)
    assert deleted.status_code == 200 and deleted.json()["version"] is None
    again = await registry.client.delete("/v1/adapters/bot/aliases/live",
                                         headers=registry.admin_headers)
    assert again.status_code == 404 and again.json()["error"]["code"] == "alias_not_found"
    status, state = await _put(registry, 1)
    assert status == 200 and state["revision"] == 3


async def test_errors(registry: RegistryHarness, tmp_path: Path) -> None:
    await _three_versions(registry, tmp_path)
    status, body = await _put(registry, 99)
    assert status == 404 and body["error"]["code"] == "version_not_found"
    status, body = await _put(registry, 1, alias="Not A Slug")
    assert status == 422 and body["error"]["code"] == "invalid_alias"
    status, body = await _put(registry, 1, alias="7")
    assert status == 422 and body["error"]["code"] == "invalid_alias"
    await _put(registry, 1)
    rolled = await registry.client.post("/v1/adapters/bot/aliases/live/rollback",
                                        headers=registry.admin_headers)
    assert rolled.status_code == 409 and rolled.json()["error"]["code"] == "no_previous_version"
    status, body = await _put(registry, 2, expected=0)
    assert status == 409 and body["error"]["code"] == "revision_conflict"
    assert body["error"]["detail"]["revision"] == 1


async def test_concurrent_conditional_moves_exactly_one_wins(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await _three_versions(registry, tmp_path)
    await _put(registry, 1)
    results = await asyncio.gather(*(_put(registry, v, expected=1) for v in (2, 3, 2, 3, 2, 3)))
    statuses = sorted(status for status, _ in results)
    assert statuses == [200, 409, 409, 409, 409, 409], results
    winner = next(body for status, body in results if status == 200)
    shown = (await registry.client.get("/v1/adapters/bot", headers=registry.admin_headers)).json()
    assert shown["aliases"][0]["version"] == winner["version"]
    assert shown["aliases"][0]["revision"] == 2


async def _rollback(registry: RegistryHarness) -> tuple[int, dict[str, Any]]:
    response = await registry.client.post("/v1/adapters/bot/aliases/live/rollback",
                                          headers=registry.admin_headers)
    return response.status_code, response.json()


async def test_repeated_rollbacks_walk_back_through_history(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await registry.create_adapter("bot")
    for seed in (1, 2, 3):  # each push moves live: v1, then v2, then v3
        folder = make_adapter(tmp_path / str(seed), seed=seed)
        assert (await upload_dir(registry, "bot", folder)).status_code == 201
    status, state = await _rollback(registry)
    assert status == 200 and (state["version"], state["previous_version"]) == (2, 3)
    status, state = await _rollback(registry)
    assert status == 200 and (state["version"], state["previous_version"]) == (1, 2)
    status, body = await _rollback(registry)
    assert status == 409 and body["error"]["code"] == "no_previous_version", body


async def test_rollback_undoes_the_latest_move_not_yet_undone(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await _three_versions(registry, tmp_path)
    for version in (1, 2, 3):
        await _put(registry, version)
    assert (await _rollback(registry))[1]["version"] == 2
    await _put(registry, 1)  # a new move after a rollback is the next one undone
    assert (await _rollback(registry))[1]["version"] == 2
    assert (await _rollback(registry))[1]["version"] == 1
    assert (await _rollback(registry))[0] == 409
