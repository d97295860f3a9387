"""A name is a slug from its first character to its last: no trailing newline slips
through a ``$`` that matches before it."""

from __future__ import annotations

from pathlib import Path

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import upload_dir
from loraplane.naming import is_slug, parse_model_ref


def test_is_slug_refuses_a_trailing_newline() -> None:
    assert is_slug("live")
    assert not is_slug("live\n")
    assert parse_model_ref("bot\n") is None
    assert parse_model_ref("bot@live\n") is None
    assert parse_model_ref("bot@7\n") is None
    assert parse_model_ref("bot@\u00b2") is None


async def test_names_with_a_trailing_newline_are_refused(
    embedded_registry: RegistryHarness, tmp_path: Path
) -> None:
    registry, headers = embedded_registry, embedded_registry.admin_headers
    await registry.create_adapter("a-bot")
    assert (await upload_dir(registry, "a-bot", make_adapter(tmp_path / "a", seed=1))
            ).status_code == 201
    alias = await registry.client.put("/v1/adapters/a-bot/aliases/live%0A",
                                      json={"version": 1}, headers=headers)
    assert alias.status_code == 422 and alias.json()["error"]["code"] == "invalid_alias"
    created = await registry.client.post(
        "/v1/adapters", json={"name": "b-bot\n", "base_model": "m", "tenant": "acme"},
        headers=headers)
    assert created.status_code == 422, created.text
    tenant = await registry.client.post(
        "/v1/adapters", json={"name": "c-bot", "base_model": "m", "tenant": "acme\n"},
        headers=headers)
    assert tenant.status_code == 422, tenant.text
    route = await registry.client.put("/v1/routes/customer/c-1%0A", json={"adapter": "a-bot"},
                                      headers=headers)
    assert route.status_code == 422 and route.json()["error"]["code"] == "invalid_route_key"
    shown = await registry.client.get("/v1/adapters/a-bot", headers=headers)
    assert [a["alias"] for a in shown.json()["aliases"]] == ["live"]
