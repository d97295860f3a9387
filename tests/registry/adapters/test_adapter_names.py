"""Adapter names are global (like S3 bucket names): a taken name answers the same
whoever holds it, and a global admin may free a deleted adapter's retired name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import upload_dir
from tests.registry.auth.principals import assert_error


async def create(registry: RegistryHarness, name: str, headers: dict[str, str]) -> Any:
    return await registry.client.post("/v1/adapters", json={"name": name, "base_model": "m"},
                                      headers=headers)


async def test_a_taken_name_answers_the_same_whoever_holds_it(
    embedded_registry: RegistryHarness,
) -> None:
    registry = embedded_registry
    await registry.create_adapter("mine", tenant="acme")
    await registry.create_adapter("theirs", tenant="globex")
    await registry.create_adapter("gone", tenant="globex")
    deleted = await registry.client.delete("/v1/adapters/gone", headers=registry.admin_headers)
    assert deleted.status_code == 204
    publisher = await registry.token("publisher", "acme")
    answers = []
    for name in ("mine", "theirs", "gone"):
        response = await create(registry, name, publisher)
        assert_error(response, 409, "adapter_name_taken")
        body = response.json()["error"]
        # Nothing in it tells who holds the name, or that it is retired.
        assert body["detail"] == {"adapter": name}
        answers.append(body["message"].replace(name, "NAME"))
    assert answers[0] == answers[1] == answers[2]


async def test_a_global_admin_frees_a_retired_name(
    registry: RegistryHarness, tmp_path: Path,
) -> None:
    await registry.create_adapter("bot", tenant="globex")
    assert (await upload_dir(registry, "bot", make_adapter(tmp_path / "a", seed=1))
            ).status_code == 201
    path = "/v1/retired-names/bot"
    # A live adapter's name is not retired.
    assert_error(await registry.client.delete(path, headers=registry.admin_headers), 404,
                 "retired_name_not_found")
    assert (await registry.client.delete("/v1/adapters/bot", headers=registry.admin_headers)
            ).status_code == 204
    for who in (await registry.token("admin", "globex"), await registry.token("agent")):
        assert_error(await registry.client.delete(path, headers=who), 403, "insufficient_role")
    assert (await registry.client.delete(path, headers=registry.admin_headers)
            ).status_code == 204
    assert_error(await registry.client.delete(path, headers=registry.admin_headers), 404,
                 "retired_name_not_found")
    # Any tenant may take the name now; the deleted adapter is not brought back.
    made = await create(registry, "bot", await registry.token("publisher", "acme"))
    assert made.status_code == 201, made.text
    shown = (await registry.client.get("/v1/adapters/bot", headers=registry.admin_headers)
             ).json()
    assert (shown["tenant"], shown["latest_version"]) == ("acme", None)
    events = (await registry.client.get("/v1/events", headers=registry.admin_headers)).json()
    [freed] = [e for e in events["events"] if e["type"] == "adapter_name_freed"]
    assert (freed["tenant"], freed["adapter"]) == ("globex", "bot")
