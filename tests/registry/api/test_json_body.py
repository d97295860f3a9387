"""The status report's body, read by pydantic-core from its bytes
(``registry_service/api/json_body.py``): the same refusals FastAPI's own body gave, and
the report stored as written (``JsonText``)."""

from __future__ import annotations

import json
from typing import Any

from devharness.registry import RegistryHarness
from registry_service.db.engine import JsonText, json_dumps
from tests.registry.agents.support import fleet, report, served
from tests.registry.auth.principals import assert_error


async def _post(registry: RegistryHarness, content: bytes,
                content_type: str | None = "application/json") -> Any:
    headers = dict(registry.admin_headers)
    if content_type is not None:
        headers["Content-Type"] = content_type
    return await registry.client.post("/v1/agents/gpu-1/status", content=content,
                                      headers=headers)


def _errors(response: Any) -> list[dict[str, Any]]:
    assert_error(response, 422, "invalid_request")
    errors: list[dict[str, Any]] = response.json()["error"]["detail"]["errors"]
    return errors


async def test_a_body_that_is_not_json_is_refused_under_body(
        registry: RegistryHarness) -> None:
    for content in (b"", b"{", b"not json", b'{"agent_id": "gpu-1",}'):
        errors = _errors(await _post(registry, content))
        assert [e["loc"][0] for e in errors] == ["body"], (content, errors)
    good = json.dumps(report("gpu-1")).encode()
    errors = _errors(await _post(registry, good, "text/plain"))
    assert errors == [{"loc": ["body"],
                       "msg": "the body must be JSON (Content-Type: application/json)"}]
    assert await fleet(registry) == {}


async def test_each_problem_is_located_in_the_body(registry: RegistryHarness) -> None:
    body = report("gpu-1", entries=[served("bot", 1)])
    body["served"][0]["state"] = "exploded"
    del body["time"]
    errors = _errors(await _post(registry, json.dumps(body).encode()))
    assert sorted(tuple(e["loc"]) for e in errors) == [
        ("body", "served", "0", "state"), ("body", "time")]
    assert await fleet(registry) == {}


async def test_json_bodies_by_any_json_media_type_are_stored_as_sent(
        registry: RegistryHarness) -> None:
    for version, content_type in enumerate(
            (None, "application/json; charset=utf-8", "application/vnd.agent+json"), 1):
        body = report("gpu-1", entries=[served("bot", version)], loaded=[f"bot@{version}"])
        response = await _post(registry, json.dumps(body).encode(), content_type)
        assert response.status_code == 200, (content_type, response.text)
        stored = (await fleet(registry))["gpu-1"]["status"]
        assert stored["served"] == body["served"] and stored["loaded"] == body["loaded"]


def test_json_written_already_is_stored_as_it_is() -> None:
    written = JsonText('{"b": 1, "a": [2]}')
    assert json_dumps(written) == '{"b": 1, "a": [2]}'
    assert type(json_dumps(written)) is str
    # Anything else is still written here, a string included.
    assert json_dumps("x") == '"x"' and json_dumps({"a": 1}) == '{"a":1}'
