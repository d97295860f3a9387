"""``GET /v1/whoami``: every token may see who it is (``loraplane whoami``)."""

from __future__ import annotations

from devharness.registry import RegistryHarness
from tests.registry.auth.principals import OWN, assert_error, principals

LISTED_FIELDS = {"id", "name", "role", "tenant", "prefix", "created_at", "revoked_at",
                 "agent_id"}


async def test_every_token_sees_its_own_name_role_and_tenant(registry: RegistryHarness
                                                             ) -> None:
    who = await principals(registry)
    for name, headers in who.items():
        response = await registry.client.get("/v1/whoami", headers=headers)
        if name == "no-token":
            assert_error(response, 401, "missing_token")
            continue
        if name == "invalid-token":
            assert_error(response, 401, "invalid_token")
            continue
        assert response.status_code == 200, f"{name}: {response.text}"
        body = response.json()
        assert set(body) == LISTED_FIELDS, body
        role, _, tenant = name.partition("@")
        expected_role = "admin" if role == "global-admin" else role
        assert (body["role"], body["tenant"]) == (expected_role, tenant or None), name
        secret = headers["Authorization"].removeprefix("Bearer ")
        assert secret.startswith(body["prefix"]) and secret not in response.text


async def test_a_revoked_token_is_refused(registry: RegistryHarness) -> None:
    created = await registry.client.post(
        "/v1/tokens", json={"name": "gone", "role": "reader", "tenant": OWN},
        headers=registry.admin_headers)
    assert created.status_code == 201, created.text
    token = created.json()
    revoked = await registry.client.delete(f"/v1/tokens/{token['id']}",
                                           headers=registry.admin_headers)
    assert revoked.status_code == 204, revoked.text
    response = await registry.client.get(
        "/v1/whoami", headers={"Authorization": f"Bearer {token['secret']}"})
    assert_error(response, 401, "invalid_token")
