"""The role x tenant matrix of principals, as request headers, for API tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from devharness.registry import RegistryHarness

OWN = "acme"
OTHER = "globex"


@dataclass(frozen=True)
class Expected:
    status: int
    code: str | None = None


async def principals(registry: RegistryHarness) -> dict[str, dict[str, str]]:
    """Headers by principal name: ``role@tenant``, global ones, and no/invalid tokens."""
    headers = {"global-admin": registry.admin_headers,
               "agent": await registry.token("agent")}
    for tenant in (OWN, OTHER):
        for role in ("reader", "publisher", "admin"):
            headers[f"{role}@{tenant}"] = await registry.token(role, tenant)
    headers["no-token"] = {}
    headers["invalid-token"] = {"Authorization": "Bearer lp_not-a-real-token"}
    return headers


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> None:
    """The response is an error of ``status`` (and ``code``) in the one error shape."""
    assert response.status_code == status, response.text
    body: Any = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "detail"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["detail"], dict)
    if code is not None:
        assert body["error"]["code"] == code, body


def assert_outcome(response: httpx.Response, expected: Expected, who: str) -> None:
    if expected.status < 400:
        assert response.status_code == expected.status, f"{who}: {response.text}"
    else:
        try:
            assert_error(response, expected.status, expected.code)
        except AssertionError as exc:
            raise AssertionError(f"{who}: {exc}") from exc


# The outcome of a publisher-level write on a resource of tenant OWN, by principal. The
# role is checked before the tenant, so a reader of another tenant is told about its
# role (which reveals nothing about the resource).
PUBLISHER_WRITE = {
    "global-admin": Expected(200),
    "admin@acme": Expected(200),
    "publisher@acme": Expected(200),
    "reader@acme": Expected(403, "insufficient_role"),
    "admin@globex": Expected(404),
    "publisher@globex": Expected(404),
    "reader@globex": Expected(403, "insufficient_role"),
    "agent": Expected(403, "insufficient_role"),
    "no-token": Expected(401, "missing_token"),
    "invalid-token": Expected(401, "invalid_token"),
}


def or_admin(registry: RegistryHarness, headers: dict[str, str] | None) -> dict[str, str]:
    """``headers``, or the global admin's when None (an empty dict means no token)."""
    return registry.admin_headers if headers is None else headers
