"""The version history (``GET /v1/adapters/{name}/versions``), written straight to JSON
by ``versions/history.py``: it must answer exactly what the models describe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import upload_dir
from loraplane.api.versions import VersionPage


async def _history(registry: RegistryHarness, name: str, limit: int,
                   headers: dict[str, str]) -> list[dict[str, Any]]:
    """Every page, following ``next_cursor``; each page checked against the model."""
    listed: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = {"limit": str(limit), **({"cursor": cursor} if cursor else {})}
        response = await registry.client.get(f"/v1/adapters/{name}/versions", params=params,
                                              headers=headers)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "application/json"
        page = response.json()
        # Exactly the documented shape: the model reads it and writes it back unchanged.
        assert VersionPage.model_validate(page).model_dump(mode="json") == page
        assert len(page["versions"]) <= limit
        listed += page["versions"]
        cursor = page["next_cursor"]
        if cursor is None:
            return listed


async def test_each_listed_version_is_the_version_shown(registry: RegistryHarness,
                                                        tmp_path: Path) -> None:
    await registry.create_adapter("bot", tenant="acme")
    for number, (rank, targets) in enumerate([(4, ("q_proj",)), (8, ("q_proj", "v_proj")),
                                              (8, ("q_proj", "v_proj")), (16, ("v_proj",)),
                                              (8, ("q_proj", "v_proj"))], start=1):
        folder = make_adapter(tmp_path / f"v{number}", rank=rank, alpha=2.5 * number,
                              targets=targets, seed=number)
        response = await upload_dir(registry, "bot", folder, notes=f"note «{number}»",
                                    aliases=None)
        assert response.status_code == 201, response.text
    reader = await registry.token("reader", "acme")

    listed = await _history(registry, "bot", 2, reader)

    assert [v["version"] for v in listed] == [5, 4, 3, 2, 1]
    for entry in listed:
        shown = await registry.client.get(f"/v1/adapters/bot/versions/{entry['version']}",
                                          headers=reader)
        assert entry == shown.json()
    assert listed[4]["notes"] == "note «1»" and listed[4]["rank"] == 4
    assert listed[0]["files"][0]["url"] == (
        f"/v1/adapters/bot/versions/5/files/{listed[0]['files'][0]['name']}")


async def test_empty_and_unseen_histories(registry: RegistryHarness, tmp_path: Path) -> None:
    await registry.create_adapter("fresh", tenant="acme")
    await registry.create_adapter("gone", tenant="acme")
    response = await upload_dir(registry, "gone", make_adapter(tmp_path / "a"))
    assert response.status_code == 201, response.text
    reader = await registry.token("reader", "acme")
    assert await _history(registry, "fresh", 10, reader) == []
    below_the_first = await registry.client.get("/v1/adapters/gone/versions",
                                                params={"cursor": "1"}, headers=reader)
    assert below_the_first.json() == {"versions": [], "next_cursor": None}

    deleted = await registry.client.delete("/v1/adapters/gone", headers=registry.admin_headers)
    assert deleted.status_code in (200, 204), deleted.text
    other_tenant = await registry.token("reader", "globex")
    for name, headers in (("gone", reader), ("fresh", other_tenant), ("never", reader)):
        response = await registry.client.get(f"/v1/adapters/{name}/versions", headers=headers)
        assert response.status_code == 404, (name, response.text)
        assert response.json()["error"]["code"] == "adapter_not_found"


async def test_the_history_authenticates_its_caller(registry: RegistryHarness) -> None:
    """The history authenticates in its own read's session (deps.get_reader): every
    refusal of the registry's other reads still holds."""
    await registry.create_adapter("bot", tenant="acme")
    url = "/v1/adapters/bot/versions"
    missing = await registry.client.get(url)
    unknown = await registry.client.get(url, headers={"Authorization": "Bearer lp_nope"})
    inference = await registry.client.get(url, headers=await registry.token("inference",
                                                                              "acme"))
    assert (missing.status_code, missing.json()["error"]["code"]) == (401, "missing_token")
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (401, "invalid_token")
    assert (inference.status_code, inference.json()["error"]["code"]) == (
        403, "insufficient_role")
