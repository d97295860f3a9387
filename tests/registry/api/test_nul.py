"""A NUL character in a query, a path or a body: Postgres stores no NUL in text, and
schemathesis found ``GET /v1/agents?base_model=...%00...`` answering 500 there."""

from __future__ import annotations

from devharness.registry import RegistryHarness


async def test_a_nul_character_is_refused_not_a_server_error(
        pg_registry: RegistryHarness) -> None:
    registry, headers = pg_registry, pg_registry.admin_headers
    await registry.create_adapter("a-bot")
    calls = [
        registry.client.get("/v1/agents", params={"base_model": "m\x00"}, headers=headers),
        registry.client.get("/v1/adapters", params={"base_model": "m\x00"}, headers=headers),
        registry.client.get("/v1/adapters/a%00bot", headers=headers),
        registry.client.post("/v1/adapters", headers=headers, json={
            "name": "b-bot", "base_model": "m", "tenant": "acme", "description": "x\x00"}),
        registry.client.patch("/v1/adapters/a-bot", headers=headers,
                              json={"description": "x\x00"}),
    ]
    for call in calls:
        response = await call
        assert response.status_code in (404, 422), (response.request.url, response.text)
        if response.status_code == 422:
            assert response.json()["error"]["code"] == "invalid_character", response.text
    listed = await registry.client.get("/v1/adapters", headers=headers)
    assert [a["name"] for a in listed.json()["adapters"]] == ["a-bot"]
