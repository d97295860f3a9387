"""The client's error mapping, pagination and URL building, against a mock transport."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import httpx
import pytest

from loraplane.client import (
    AsyncRegistryClient,
    BadRequest,
    BadResponse,
    Conflict,
    DownloadFailed,
    Forbidden,
    InvalidURL,
    NotFound,
    RateLimited,
    RegistryClient,
    RegistryError,
    ServerError,
    TimedOut,
    Unauthorized,
    Unreachable,
    path,
)
from loraplane.netutil import free_port

Handler = Callable[[httpx.Request], httpx.Response]


def client_for(handler: Handler, token: str | None = "tok") -> RegistryClient:
    return RegistryClient("http://registry.test", token, transport=httpx.MockTransport(handler))


def error_body(code: str, message: str, detail: Mapping[str, object] | None = None
               ) -> dict[str, object]:
    return {"error": {"code": code, "message": message, "detail": detail or {}}}


def test_the_registry_error_shape_becomes_status_code_message_and_detail() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer tok"
        assert request.url.path == "/v1/adapters/x"
        return httpx.Response(404, json=error_body("adapter_not_found",
                                                   "adapter 'x' not found", {"adapter": "x"}))

    with client_for(handler) as client, pytest.raises(NotFound) as caught:
        client.get_adapter("x")
    error = caught.value
    assert (error.status, error.code, error.message) == (404, "adapter_not_found",
                                                         "adapter 'x' not found")
    assert error.detail == {"adapter": "x"} and not error.retryable


@pytest.mark.parametrize(("status", "kind", "retryable"), [
    (400, BadRequest, False), (401, Unauthorized, False), (403, Forbidden, False),
    (404, NotFound, False), (409, Conflict, False), (413, BadRequest, False),
    (422, BadRequest, False), (429, RateLimited, True), (500, ServerError, True),
    (503, ServerError, True),
])
def test_each_status_maps_to_its_kind(status: int, kind: type[RegistryError],
                                      retryable: bool) -> None:
    with client_for(lambda _: httpx.Response(status, json=error_body("x", "no"))) as client, \
            pytest.raises(RegistryError) as caught:
        client.list_tokens()
    assert type(caught.value) is kind
    assert caught.value.retryable is retryable and caught.value.status == status


def test_validation_errors_name_the_fields() -> None:
    detail = {"errors": [{"loc": ["body", "name"], "msg": "String should match pattern"},
                         {"loc": ["query", "limit"], "msg": "Input should be >= 1"}]}

    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(422, json=error_body("invalid_request", "the request is invalid",
                                                   detail))

    with client_for(handler) as client, pytest.raises(BadRequest) as caught:
        client.create_adapter("Bad Name", "m")
    assert caught.value.message == ("the request is invalid: name: String should match "
                                    "pattern; query.limit: Input should be >= 1")
    assert caught.value.code == "invalid_request"


def test_a_response_not_from_the_registry_is_still_a_clear_error() -> None:
    with client_for(lambda _: httpx.Response(502, text="<html>Bad Gateway</html>")) as client, \
            pytest.raises(ServerError) as caught:
        client.list_adapters()
    assert (caught.value.code, caught.value.status) == ("http_502", 502)
    assert "HTTP 502 Bad Gateway from http://registry.test/v1/adapters" in caught.value.message
    assert "<html>Bad Gateway</html>" in caught.value.message


def test_no_token_sends_no_authorization() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert "authorization" not in request.headers
        return httpx.Response(401, json=error_body("missing_token", "a bearer token is required"))

    with client_for(handler, token=None) as client, pytest.raises(Unauthorized) as caught:
        client.list_adapters()
    assert caught.value.message == "a bearer token is required"
    assert not client.config.has_token


def test_a_success_off_the_contract_is_a_bad_response() -> None:
    with client_for(lambda _: httpx.Response(200, text="hello")) as client, \
            pytest.raises(BadResponse, match="not JSON"):
        client.list_tokens()
    with client_for(lambda _: httpx.Response(200, json={"tokens": "no"})) as client, \
            pytest.raises(BadResponse, match="TokenList") as caught:
        client.list_tokens()
    assert caught.value.retryable


def test_an_empty_204_is_none() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert (request.method, request.url.path) == ("DELETE", "/v1/tokens/3")
        return httpx.Response(204)

    with client_for(handler) as client:
        client.revoke_token(3)


def test_connection_refused_is_retryable_and_names_the_registry_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with RegistryClient(url, "tok", timeout_s=5) as client, pytest.raises(Unreachable) as caught:
        client.list_adapters()
    assert caught.value.code == "unreachable" and caught.value.retryable
    assert caught.value.message.startswith(f"cannot reach the registry at {url}")
    assert caught.value.status is None


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A socket that accepts connections and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


def test_a_registry_that_never_answers_times_out(silent_server: str) -> None:
    with RegistryClient(silent_server, "tok", timeout_s=0.3) as client, \
            pytest.raises(TimedOut) as caught:
        client.list_adapters()
    assert caught.value.code == "timeout" and caught.value.retryable
    assert "did not answer in time" in caught.value.message


async def test_the_async_client_maps_the_same_way(silent_server: str) -> None:
    async with AsyncRegistryClient(silent_server, "tok", timeout_s=0.3) as client:
        with pytest.raises(TimedOut):
            await client.list_adapters()

    async def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json=error_body("revision_conflict", "moved meanwhile"))

    async with AsyncRegistryClient("http://registry.test", "tok",
                                   transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(Conflict, match="moved meanwhile"):
            await client.move_alias("bot", "live", 2, expected_revision=1)


def test_a_bad_registry_url_is_invalid() -> None:
    with RegistryClient("ftp://example.invalid", "tok") as client, \
            pytest.raises(InvalidURL) as caught:
        client.list_adapters()
    assert caught.value.code == "invalid_url" and not caught.value.retryable


def test_path_segments_cannot_escape_their_route() -> None:
    assert path("adapters", "a/../b", "versions", 3) == "/v1/adapters/a%2F..%2Fb/versions/3"
    assert path("adapters", "x?y#z") == "/v1/adapters/x%3Fy%23z"


def version_json(number: int) -> dict[str, object]:
    return {"adapter": "a", "version": number, "digest": "d" * 64, "base_model": "m", "rank": 8,
            "alpha": 16.0, "target_modules": [], "files": [], "total_size": 1,
            "uploader": "u", "notes": "", "created_at": "2026-01-01T00:00:00Z"}


def test_listing_follows_cursors_and_stops_at_the_limit() -> None:
    seen: list[dict[str, str]] = []
    items = [version_json(v) for v in range(10, 0, -1)]

    def handler(request: httpx.Request) -> httpx.Response:
        query = dict(request.url.params)
        seen.append(query)
        start = int(query.get("cursor", "0"))
        end = start + int(query["limit"])
        cursor = str(end) if end < len(items) else None
        return httpx.Response(200, json={"versions": items[start:end], "next_cursor": cursor})

    with client_for(handler) as client:
        assert [v.version for v in client.list_versions("a", page_size=4)] == list(
            range(10, 0, -1))
        assert [q.get("cursor") for q in seen] == [None, "4", "8"]
        seen.clear()
        assert [v.version for v in client.list_versions("a", limit=5, page_size=3)] == [
            10, 9, 8, 7, 6]
        assert [(q.get("limit"), q.get("cursor")) for q in seen] == [("3", None), ("2", "3")]


def test_unset_options_stay_out_of_the_query_and_body() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            assert dict(request.url.params) == {"tenant": "acme", "limit": "100"}
            return httpx.Response(200, json={"adapters": [], "next_cursor": None})
        assert request.content == b'{"version":2}'
        return httpx.Response(200, json={"adapter": "a", "alias": "live", "version": 2,
                                         "previous_version": 1, "revision": 2,
                                         "changed": True})

    with client_for(handler) as client:
        assert client.list_adapters(tenant="acme") == []
        assert client.move_alias("a", "live", 2).changed


def test_following_events_retries_an_unavailable_registry_and_raises_a_refusal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    answers = [httpx.Response(503, json=error_body("starting", "not ready")),
               httpx.Response(502, text="bad gateway"),
               httpx.Response(200, json={"events": [{"seq": 1, "type": "x"}], "next_after": 1}),
               httpx.Response(403, json=error_body("forbidden", "no"))]
    asked: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.params.get("after"))
        return answers.pop(0)

    waits: list[float] = []
    monkeypatch.setattr("loraplane.client.sync.time.sleep", waits.append)
    told: list[tuple[str | None, int]] = []
    with client_for(handler) as client:
        follow = client.follow_events(
            on_retry=lambda error, failures: told.append(
                (error.code if error else None, failures)))
        assert next(follow) == {"seq": 1, "type": "x"}
        with pytest.raises(Forbidden):
            next(follow)
    assert told == [("starting", 1), ("http_502", 2), (None, 0)]
    assert waits == [1.0, 2.0] and asked == ["0", "0", "0", "1"]


@pytest.mark.parametrize("url", [
    "https://attacker.example/v1/adapters/a/versions/1/files/x", "//attacker.example/v1/x",
    "/v1/../../etc/passwd", "/v1/adapters/a/./x", "/v1//x", "/steal", "v1/x",
    "/v1/x?y=1", "/v1/x#frag", "/v1\\x",
])
def test_a_file_url_off_the_registry_is_never_fetched(url: str, tmp_path: Path) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=b"x")

    client = RegistryClient("http://registry", "secret-token",
                            transport=httpx.MockTransport(handler))
    with pytest.raises(DownloadFailed) as refused:
        client.download(url, tmp_path / "f", size=1, sha256="0" * 64)
    assert refused.value.code == "foreign_file_url" and seen == []
