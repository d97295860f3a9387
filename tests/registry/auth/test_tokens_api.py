"""Tokens over the REST API: creation (secret shown once), listing, revocation."""

from __future__ import annotations

import hashlib
from typing import Any

from devharness.registry import RegistryHarness
from tests.registry.auth.principals import (
    OTHER,
    OWN,
    Expected,
    assert_error,
    assert_outcome,
    or_admin,
    principals,
)

LISTED_FIELDS = {"id", "name", "role", "tenant", "prefix", "created_at", "revoked_at",
                 "agent_id"}


async def create(registry: RegistryHarness, body: dict[str, Any],
                 headers: dict[str, str] | None = None) -> Any:
    return await registry.client.post("/v1/tokens", json=body,
                                      headers=or_admin(registry, headers))


async def listing(registry: RegistryHarness, headers: dict[str, str] | None = None,
                  **params: str) -> list[dict[str, Any]]:
    response = await registry.client.get("/v1/tokens", params=params,
                                         headers=or_admin(registry, headers))
    assert response.status_code == 200, response.text
    tokens: list[dict[str, Any]] = response.json()["tokens"]
    return tokens


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def test_a_created_token_works_and_its_secret_is_shown_once(
    registry: RegistryHarness,
) -> None:
    response = await create(registry, {"name": " ci deploy ", "role": "publisher",
                                       "tenant": OWN})
    assert response.status_code == 201, response.text
    body = response.json()
    secret = body.pop("secret")
    assert set(body) == LISTED_FIELDS
    assert (body["name"], body["role"], body["tenant"]) == ("ci deploy", "publisher", OWN)
    assert secret.startswith(body["prefix"]) and len(secret) > len(body["prefix"]) + 20
    assert body["revoked_at"] is None
    # The token acts as a publisher of its tenant.
    created = await registry.client.post(
        "/v1/adapters", json={"name": "bot", "base_model": "m", "tenant": OWN},
        headers=bearer(secret))
    assert created.status_code == 201, created.text
    raw = (await registry.client.get("/v1/tokens", headers=registry.admin_headers)).text
    assert secret not in raw and hashlib.sha256(secret.encode()).hexdigest() not in raw
    for token in await listing(registry):
        assert set(token) == LISTED_FIELDS


async def test_who_may_create_which_token(registry: RegistryHarness) -> None:
    who = await principals(registry)
    reader_own = {"name": "x", "role": "reader", "tenant": OWN}
    cases: list[tuple[str, dict[str, Any], Expected]] = [
        ("global-admin", {"name": "x", "role": "admin"}, Expected(201)),
        ("global-admin", {"name": "x", "role": "agent"}, Expected(201)),
        ("global-admin", {"name": "x", "role": "admin", "tenant": "newco"}, Expected(201)),
        (f"admin@{OWN}", reader_own, Expected(201)),
        (f"admin@{OWN}", {"name": "x", "role": "admin", "tenant": OWN}, Expected(201)),
        (f"admin@{OWN}", {"name": "x", "role": "reader", "tenant": OTHER},
         Expected(403, "tenant_forbidden")),
        (f"admin@{OWN}", {"name": "x", "role": "admin"}, Expected(403, "tenant_forbidden")),
        (f"admin@{OWN}", {"name": "x", "role": "agent"}, Expected(403, "tenant_forbidden")),
        (f"admin@{OTHER}", reader_own, Expected(403, "tenant_forbidden")),
        (f"publisher@{OWN}", reader_own, Expected(403, "insufficient_role")),
        (f"reader@{OWN}", reader_own, Expected(403, "insufficient_role")),
        ("agent", reader_own, Expected(403, "insufficient_role")),
        ("no-token", reader_own, Expected(401, "missing_token")),
        ("invalid-token", reader_own, Expected(401, "invalid_token")),
    ]
    for name, body, expected in cases:
        before = len(await listing(registry, include_revoked="true"))
        response = await create(registry, body, who[name])
        assert_outcome(response, expected, f"{name} creating {body}")
        after = len(await listing(registry, include_revoked="true"))
        assert after == before + (1 if expected.status == 201 else 0), name


async def test_bad_token_requests_are_refused(registry: RegistryHarness) -> None:
    cases: list[tuple[Any, int, str]] = [
        ({"name": "x", "role": "reader"}, 400, "tenant_required"),
        ({"name": "x", "role": "publisher"}, 400, "tenant_required"),
        ({"name": "x", "role": "agent", "tenant": OWN}, 400, "agent_token_global"),
        ({"name": "x", "role": "root", "tenant": OWN}, 422, "invalid_request"),
        ({"name": "", "role": "reader", "tenant": OWN}, 422, "invalid_request"),
        ({"name": "   ", "role": "reader", "tenant": OWN}, 422, "invalid_request"),
        ({"name": "x" * 256, "role": "reader", "tenant": OWN}, 422, "invalid_request"),
        ({"role": "reader", "tenant": OWN}, 422, "invalid_request"),
        ({"name": "x", "role": "reader", "tenant": "Not A Slug"}, 422, "invalid_name"),
        ({"name": "x", "role": "reader", "tenant": OWN, "secret": "mine"}, 422,
         "invalid_request"),
        ("not an object", 422, "invalid_request"),
    ]
    for body, status, code in cases:
        assert_error(await create(registry, body), status, code)
    assert [t["name"] for t in await listing(registry)] == ["bootstrap-admin"]


async def test_names_with_terminal_controls_are_refused(registry: RegistryHarness) -> None:
    # Issue 35, Medium 13: such a name reached admins' terminals raw (token list, history).
    for name in ["evil\x1b[2J\x1b]0;owned\x07", "nul\x00", "del\x7f", "c1\x9b31m",
                 "bidi\u202eexe.txt", "isolate\u2066x", "line\u2028sep", "zero\u200bwidth"]:
        response = await create(registry, {"name": name, "role": "reader", "tenant": OWN})
        assert_error(response, 422, "invalid_request")
        (error,) = response.json()["error"]["detail"]["errors"]
        assert error["loc"] == ["body", "name"]
        assert "control or formatting characters" in error["msg"]
        adapter = await registry.client.post(
            "/v1/adapters", json={"name": "bot", "base_model": name, "tenant": OWN},
            headers=registry.admin_headers)
        assert_error(adapter, 422, "invalid_request")
        assert adapter.json()["error"]["detail"]["errors"][0]["loc"] == ["body", "base_model"]
    assert [t["name"] for t in await listing(registry)] == ["bootstrap-admin"]
    # Letters of any script, and emoji, are names like any other.
    response = await create(registry, {"name": "déploiement ⚙ 部署", "role": "reader",
                                       "tenant": OWN})
    assert response.status_code == 201, response.text


async def test_listing_is_admin_only_and_scoped(registry: RegistryHarness) -> None:
    who = await principals(registry)
    everyone = {t["name"] for t in await listing(registry)}
    assert everyone == {"bootstrap-admin", "agent-global", f"reader-{OWN}",
                        f"publisher-{OWN}", f"admin-{OWN}", f"reader-{OTHER}",
                        f"publisher-{OTHER}", f"admin-{OTHER}"}
    own = await listing(registry, who[f"admin@{OWN}"])
    assert {t["name"] for t in own} == {f"reader-{OWN}", f"publisher-{OWN}", f"admin-{OWN}"}
    assert {t["tenant"] for t in own} == {OWN}
    for name in (f"publisher@{OWN}", f"reader@{OWN}", "agent"):
        response = await registry.client.get("/v1/tokens", headers=who[name])
        assert_error(response, 403, "insufficient_role")
    for name, code in (("no-token", "missing_token"), ("invalid-token", "invalid_token")):
        assert_error(await registry.client.get("/v1/tokens", headers=who[name]), 401, code)


async def test_revocation(registry: RegistryHarness) -> None:
    who = await principals(registry)
    ids = {t["name"]: t["id"] for t in await listing(registry)}

    async def revoke(token_id: Any, as_: str) -> Any:
        return await registry.client.delete(f"/v1/tokens/{token_id}", headers=who[as_])

    # Another tenant's token does not exist for a tenant admin; lower roles are refused.
    assert_error(await revoke(ids[f"reader-{OTHER}"], f"admin@{OWN}"), 404, "token_not_found")
    assert_error(await revoke(ids["bootstrap-admin"], f"admin@{OWN}"), 404, "token_not_found")
    assert_error(await revoke(ids[f"reader-{OWN}"], f"publisher@{OWN}"), 403,
                 "insufficient_role")
    assert_error(await revoke(ids[f"reader-{OWN}"], "agent"), 403, "insufficient_role")
    assert_error(await revoke(ids[f"reader-{OWN}"], "no-token"), 401, "missing_token")
    assert_error(await revoke(999_999, "global-admin"), 404, "token_not_found")
    assert_error(await revoke("abc", "global-admin"), 422, "invalid_request")
    assert (await registry.client.get("/v1/routes", headers=who[f"reader@{OWN}"])).is_success

    assert (await revoke(ids[f"reader-{OWN}"], f"admin@{OWN}")).status_code == 204
    assert_error(await registry.client.get("/v1/routes", headers=who[f"reader@{OWN}"]), 401,
                 "invalid_token")
    assert (await revoke(ids[f"reader-{OWN}"], "global-admin")).status_code == 204
    assert (await revoke(ids[f"reader-{OTHER}"], "global-admin")).status_code == 204
    active = {t["name"] for t in await listing(registry)}
    assert f"reader-{OWN}" not in active and f"reader-{OTHER}" not in active
    revoked = [t for t in await listing(registry, include_revoked="true") if t["revoked_at"]]
    assert {t["name"] for t in revoked} == {f"reader-{OWN}", f"reader-{OTHER}"}
    # The other tokens are untouched.
    assert (await registry.client.get("/v1/routes", headers=who[f"reader@{OTHER}"])).status_code \
        == 401
    assert (await registry.client.get("/v1/routes", headers=who[f"admin@{OWN}"])).is_success
