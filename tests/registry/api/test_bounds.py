"""Integers past what the database holds, and odd digits, answer a 4xx in the error
shape, on SQLite and on Postgres, and the registry keeps answering afterwards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import upload_dir

HUGE = 10**20
# Past a 32-bit column (versions, token ids, revisions) on Postgres, inside 64 bits.
PAST_INT32 = 2**31
PAST_INT64 = 2**63

# (method, url, json body, status, code)
CASES: list[tuple[str, str, dict[str, Any] | None, int, str]] = [
    ("GET", f"/v1/adapters/bot/versions/{HUGE}", None, 422, "invalid_request"),
    ("GET", f"/v1/adapters/bot/versions/{PAST_INT32}", None, 422, "invalid_request"),
    ("GET", "/v1/adapters/bot/versions/0", None, 422, "invalid_request"),
    ("GET", f"/v1/adapters/bot/versions/{HUGE}/files/adapter_config.json", None, 422,
     "invalid_request"),
    ("DELETE", f"/v1/tokens/{HUGE}", None, 422, "invalid_request"),
    ("DELETE", f"/v1/tokens/{PAST_INT32}", None, 422, "invalid_request"),
    ("GET", f"/v1/events?after={HUGE}", None, 422, "invalid_request"),
    ("GET", f"/v1/events?after={PAST_INT64}", None, 422, "invalid_request"),
    ("GET", f"/v1/adapters/bot/versions?cursor={HUGE}", None, 400, "invalid_cursor"),
    ("GET", f"/v1/adapters/bot/versions?cursor={PAST_INT32}", None, 400, "invalid_cursor"),
    ("GET", "/v1/adapters/bot/versions?cursor=%C2%B2", None, 400, "invalid_cursor"),
    ("GET", "/v1/adapters/bot/versions?cursor=-1", None, 400, "invalid_cursor"),
    ("PUT", "/v1/adapters/bot/aliases/live", {"version": HUGE}, 422, "invalid_request"),
    ("PUT", "/v1/adapters/bot/aliases/live", {"version": PAST_INT32}, 422, "invalid_request"),
    ("PUT", "/v1/adapters/bot/aliases/live", {"version": 1, "expected_revision": HUGE}, 422,
     "invalid_request"),
    ("POST", "/v1/adapters/bot/aliases/live/rollback", {"expected_revision": PAST_INT32}, 422,
     "invalid_request"),
    ("GET", f"/v1/adapters/bot/aliases/live/history?limit={HUGE}", None, 422,
     "invalid_request"),
    ("GET", f"/v1/adapters?limit={HUGE}", None, 422, "invalid_request"),
    ("GET", "/v1/adapters?cursor=AA==", None, 400, "invalid_cursor"),
    ("PATCH", "/v1/adapters/bot", {"replicas": HUGE}, 422, "invalid_replicas"),
    ("PATCH", "/v1/adapters/bot", {"replicas": PAST_INT32}, 422, "invalid_replicas"),
    ("POST", "/v1/adapters", {"name": "big", "base_model": "m", "tenant": "acme",
                              "replicas": PAST_INT64}, 422, "invalid_replicas"),
]


@pytest.fixture
async def bot(registry: RegistryHarness, tmp_path: Path) -> RegistryHarness:
    await registry.create_adapter("bot")
    response = await upload_dir(registry, "bot", make_adapter(tmp_path / "a", seed=1))
    assert response.status_code == 201, response.text
    return registry


@pytest.mark.parametrize(("method", "url", "body", "status", "code"), CASES,
                         ids=[f"{c[0]} {c[1]} {c[2]}" for c in CASES])
async def test_out_of_range_integers_answer_4xx(
    bot: RegistryHarness, method: str, url: str, body: dict[str, Any] | None, status: int,
    code: str,
) -> None:
    response = await bot.client.request(method, url, json=body, headers=bot.admin_headers)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"], error
    assert "detail" in error
    still = await bot.client.get("/v1/adapters/bot/versions/1", headers=bot.admin_headers)
    assert still.status_code == 200, still.text


async def test_largest_accepted_integers_are_plain_misses(bot: RegistryHarness) -> None:
    """The bounds are the columns' own: the largest value is a 404, not an error."""
    headers = bot.admin_headers
    missing = await bot.client.get(f"/v1/adapters/bot/versions/{2**31 - 1}", headers=headers)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "version_not_found"
    token = await bot.client.delete(f"/v1/tokens/{2**31 - 1}", headers=headers)
    assert token.status_code == 404, token.text
    events = await bot.client.get(f"/v1/events?after={2**63 - 1}", headers=headers)
    assert events.status_code == 200 and events.json()["events"] == []
    page = await bot.client.get(f"/v1/adapters/bot/versions?cursor={2**31 - 1}",
                                headers=headers)
    assert page.status_code == 200 and len(page.json()["versions"]) == 1
