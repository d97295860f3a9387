"""Adapters: create, list, show, delete, and who may see and do what."""

from __future__ import annotations

from pathlib import Path

import pytest

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import upload_dir


async def test_create_validates_and_refuses_duplicates(registry: RegistryHarness) -> None:
    created = await registry.create_adapter("bot", tenant="acme")
    assert (created["tenant"], created["latest_version"], created["aliases"]) == ("acme", None, [])
    dup = await registry.client.post("/v1/adapters", json={"name": "bot", "base_model": "m",
                                                            "tenant": "other"},
                                     headers=registry.admin_headers)
    assert dup.status_code == 409 and dup.json()["error"]["code"] == "adapter_name_taken"
    bad = await registry.client.post("/v1/adapters", json={"name": "Bad_Name", "base_model": "m",
                                                            "tenant": "acme"},
                                     headers=registry.admin_headers)
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"
    no_tenant = await registry.client.post("/v1/adapters", json={"name": "x", "base_model": "m"},
                                           headers=registry.admin_headers)
    assert no_tenant.status_code == 400
    assert no_tenant.json()["error"]["code"] == "tenant_required"


async def test_list_filters_and_paginates(embedded_registry: RegistryHarness) -> None:
    registry = embedded_registry
    for i in range(5):
        await registry.create_adapter(f"a{i}", tenant="acme" if i % 2 else "globex",
                                      base_model="m1" if i < 3 else "m2")
    names: list[str] = []
    cursor = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = (await registry.client.get("/v1/adapters", params=params,
                                          headers=registry.admin_headers)).json()
        names += [a["name"] for a in page["adapters"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert names == ["a0", "a1", "a2", "a3", "a4"]
    page = (await registry.client.get("/v1/adapters", params={"tenant": "acme", "base_model": "m1"},
                                      headers=registry.admin_headers)).json()
    assert [a["name"] for a in page["adapters"]] == ["a1"]


async def test_tenant_isolation_answers_404(registry: RegistryHarness) -> None:
    await registry.create_adapter("mine", tenant="acme")
    await registry.create_adapter("theirs", tenant="globex")
    reader = await registry.token("reader", "acme")
    listing = (await registry.client.get("/v1/adapters", headers=reader)).json()
    assert [a["name"] for a in listing["adapters"]] == ["mine"]
    for path in ("/v1/adapters/theirs", "/v1/adapters/theirs/versions",
                 "/v1/adapters/theirs/aliases/live/history", "/v1/adapters/nope"):
        response = await registry.client.get(path, headers=reader)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "adapter_not_found"


@pytest.mark.parametrize(("role", "tenant", "create", "upload", "promote", "delete"), [
    ("reader", "acme", 403, 403, 403, 403),
    ("publisher", "acme", 201, 201, 200, 403),
    ("admin", "acme", 201, 201, 200, 204),
    ("publisher", "globex", 403, 404, 404, 403),
    ("admin", "globex", 403, 404, 404, 404),
    ("agent", None, 403, 403, 403, 403),
])
async def test_role_and_tenant_matrix(
    embedded_registry: RegistryHarness, tmp_path: Path, role: str, tenant: str | None,
    create: int, upload: int, promote: int, delete: int,
) -> None:
    registry = embedded_registry
    await registry.create_adapter("bot", tenant="acme")
    first = await upload_dir(registry, "bot", make_adapter(tmp_path / "v1", seed=1))
    assert first.status_code == 201
    headers = await registry.token(role, tenant)
    made = await registry.client.post("/v1/adapters", json={"name": "new", "base_model": "m",
                                                             "tenant": "acme"}, headers=headers)
    assert made.status_code == create, made.text
    pushed = await upload_dir(registry, "bot", make_adapter(tmp_path / "v2", seed=2),
                              headers=headers)
    assert pushed.status_code == upload, pushed.text
    moved = await registry.client.put("/v1/adapters/bot/aliases/live", json={"version": 1},
                                      headers=headers)
    assert moved.status_code == promote, moved.text
    removed = await registry.client.delete("/v1/adapters/bot", headers=headers)
    assert removed.status_code == delete, removed.text


async def test_unauthenticated_requests_answer_401(embedded_registry: RegistryHarness) -> None:
    client = embedded_registry.client
    missing = await client.get("/v1/adapters")
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_token"
    wrong = await client.get("/v1/adapters", headers={"Authorization": "Bearer lp_nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_token"


async def test_delete_retires_the_name_and_clears_aliases(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await registry.create_adapter("bot")
    first = await upload_dir(registry, "bot", make_adapter(tmp_path / "a", seed=1))
    assert first.status_code == 201
    deleted = await registry.client.delete("/v1/adapters/bot", headers=registry.admin_headers)
    assert deleted.status_code == 204
    shown = await registry.client.get("/v1/adapters/bot", headers=registry.admin_headers)
    assert shown.status_code == 404
    events = (await registry.client.get("/v1/events", headers=registry.admin_headers)).json()
    tail = [(e["type"], e.get("action"), e.get("version")) for e in events["events"]][-2:]
    assert tail == [("adapter_updated", "adapter_deleted", None), ("adapter_deleted", None, None)]
    again = await registry.client.post("/v1/adapters", json={"name": "bot", "base_model": "m",
                                                              "tenant": "acme"},
                                       headers=registry.admin_headers)
    assert again.status_code == 409 and again.json()["error"]["code"] == "adapter_name_taken"
