"""The REST client's error mapping, pagination and URL building."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Mapping

import httpx
import pytest

from loraplane.cli.client import CliError, RegistryClient, path
from loraplane.netutil import free_port

Handler = Callable[[httpx.Request], httpx.Response]


def client_for(handler: Handler, token: str | None = "tok") -> RegistryClient:
    return RegistryClient("http://registry.test", token,
                          transport=httpx.MockTransport(handler))


def error_body(code: str, message: str, detail: Mapping[str, object] | None = None
               ) -> dict[str, object]:
    return {"error": {"code": code, "message": message, "detail": detail or {}}}


def test_the_registry_error_shape_becomes_code_message_and_detail() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer tok"
        return httpx.Response(404, json=error_body("adapter_not_found",
                                                   "adapter 'x' not found", {"adapter": "x"}))

    with client_for(handler) as client, pytest.raises(CliError) as caught:
        client.get(path("adapters", "x"))
    error = caught.value
    assert (error.code, error.message, error.status) == ("adapter_not_found",
                                                         "adapter 'x' not found", 404)
    assert error.detail == {"adapter": "x"}
    assert error.exit_code == 1
    assert error.as_json() == {"error": {"code": "adapter_not_found",
                                         "message": "adapter 'x' not found",
                                         "detail": {"adapter": "x"}, "status": 404}}


def test_validation_errors_name_the_fields() -> None:
    detail = {"errors": [{"loc": ["body", "name"], "msg": "String should match pattern"},
                         {"loc": ["query", "limit"], "msg": "Input should be >= 1"}]}

    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(422, json=error_body("invalid_request", "the request is invalid",
                                                   detail))

    with client_for(handler) as client, pytest.raises(CliError) as caught:
        client.post(path("adapters"), {"name": "Bad Name"})
    assert caught.value.message == ("the request is invalid: name: String should match "
                                    "pattern; query.limit: Input should be >= 1")
    assert caught.value.code == "invalid_request"


def test_a_response_not_from_the_registry_is_still_a_clear_error() -> None:
    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(502, text="<html>Bad Gateway</html>")

    with client_for(handler) as client, pytest.raises(CliError) as caught:
        client.get(path("adapters"))
    assert caught.value.code == "http_502"
    assert caught.value.status == 502
    assert "HTTP 502 Bad Gateway from http://registry.test/v1/adapters" in caught.value.message
    assert "<html>Bad Gateway</html>" in caught.value.message


def test_401_without_a_token_hints_where_tokens_come_from() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert "authorization" not in request.headers
        return httpx.Response(401, json=error_body("missing_token", "a bearer token is required"))

    with client_for(handler, token=None) as client, pytest.raises(CliError) as caught:
        client.get(path("adapters"))
    assert caught.value.message == "a bearer token is required"
    assert caught.value.hint is not None and "LORAPLANE_TOKEN" in caught.value.hint


def test_a_success_that_is_not_json_is_refused() -> None:
    with client_for(lambda _: httpx.Response(200, text="hello")) as client, \
            pytest.raises(CliError, match="not JSON"):
        client.get(path("adapters"))


def test_an_empty_204_is_none() -> None:
    with client_for(lambda _: httpx.Response(204)) as client:
        assert client.delete(path("tokens", 3)) is None


def test_connection_refused_names_the_registry_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with RegistryClient(url, "tok", timeout_s=5) as client, pytest.raises(CliError) as caught:
        client.get(path("adapters"))
    assert caught.value.code == "unreachable"
    assert caught.value.message.startswith(f"cannot reach the registry at {url}")
    assert caught.value.hint is not None and "LORAPLANE_REGISTRY" in caught.value.hint


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A socket that accepts connections and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


def test_a_registry_that_never_answers_times_out_with_a_hint(silent_server: str) -> None:
    with RegistryClient(silent_server, "tok", timeout_s=0.3) as client, \
            pytest.raises(CliError) as caught:
        client.get(path("adapters"))
    assert caught.value.code == "timeout"
    assert "did not answer in time" in caught.value.message


def test_a_bad_registry_url_is_a_usage_error() -> None:
    with RegistryClient("ftp://example.invalid", "tok") as client, \
            pytest.raises(CliError) as caught:
        client.get(path("adapters"))
    assert caught.value.code == "invalid_url"
    assert caught.value.exit_code == 2


def test_path_segments_cannot_escape_their_route() -> None:
    assert path("adapters", "a/../b", "versions", 3) == "/v1/adapters/a%2F..%2Fb/versions/3"
    assert path("adapters", "x?y#z") == "/v1/adapters/x%3Fy%23z"


def test_paginate_follows_cursors_and_stops_at_the_limit() -> None:
    seen: list[dict[str, str]] = []
    items = [{"version": v} for v in range(10, 0, -1)]

    def handler(request: httpx.Request) -> httpx.Response:
        query = dict(request.url.params)
        seen.append(query)
        start = int(query.get("cursor", "0"))
        end = start + int(query["limit"])
        cursor = str(end) if end < len(items) else None
        return httpx.Response(200, json={"versions": items[start:end], "next_cursor": cursor})

    with client_for(handler) as client:
        assert client.paginate("/v1/x", "versions", page_size=4) == items
        assert [q.get("cursor") for q in seen] == [None, "4", "8"]
        seen.clear()
        assert client.paginate("/v1/x", "versions", limit=5, page_size=3,
                               params={"tenant": "acme", "base_model": None}) == items[:5]
        assert [(q.get("limit"), q.get("cursor"), q.get("tenant")) for q in seen] == [
            ("3", None, "acme"), ("2", "3", "acme")]
