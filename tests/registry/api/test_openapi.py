"""The OpenAPI description and its docs pages: errors as answered, upload body, offline UI."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from loraplane.lora.errors import AdapterInvalid
from registry_service import errors
from registry_service.api.openapi import ERROR_STATUSES, error_responses, install_openapi
from registry_service.app import create_app
from registry_service.settings import RegistrySettings

ERROR_REF = "#/components/schemas/ErrorBody"


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    # The description and the docs pages need no database: the lifespan is not run.
    return create_app(RegistrySettings(data_dir=tmp_path / "data"))


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://registry") as client:
        yield client


def _operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in schema["paths"].items():
        for method, op in item.items():
            yield path, method, op


def _subclasses(cls: type[errors.RegistryError]) -> Iterator[type[errors.RegistryError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_status_a_domain_error_answers_has_an_entry() -> None:
    classes: list[type[errors.RegistryError]] = [errors.RegistryError,
                                                 *_subclasses(errors.RegistryError)]
    statuses = {cls.status for cls in classes}
    # AdapterInvalid is answered 422, or 413 when a file is too large.
    assert statuses | {413, 422} <= set(ERROR_STATUSES)


def test_adapter_invalid_is_not_a_registry_error() -> None:
    # If it became one, its status would come from the walk above instead.
    assert not issubclass(AdapterInvalid, errors.RegistryError)


async def test_every_error_response_has_the_registry_error_shape(app: FastAPI) -> None:
    schema = app.openapi()
    components = schema["components"]["schemas"]
    assert "HTTPValidationError" not in components
    assert set(components["ErrorBody"]["properties"]) == {"error"}
    assert set(components["ErrorInfo"]["required"]) == {"code", "message", "detail"}
    for path, method, op in _operations(schema):
        for status, response in op["responses"].items():
            if int(status) < 400 or (path, status) == ("/readyz", "503"):
                continue
            body = response["content"]["application/json"]["schema"]
            assert body == {"$ref": ERROR_REF}, (method, path, status)


async def test_errors_follow_what_each_operation_does(app: FastAPI) -> None:
    schema = app.openapi()

    def statuses(path: str, method: str) -> set[int]:
        return {int(s) for s in schema["paths"][path][method]["responses"] if int(s) >= 400}

    assert statuses("/healthz", "get") == {500}
    assert statuses("/v1/adapters/{name}", "get") == {401, 403, 404, 422, 500, 503}
    assert statuses("/v1/adapters", "post") == {400, 401, 403, 409, 413, 422, 500, 503}
    upload = statuses("/v1/adapters/{name}/versions", "post")
    assert {400, 401, 404, 409, 413, 422, 429, 500, 503, 507} <= upload


def test_a_route_declares_the_errors_the_rules_cannot_see() -> None:
    app = FastAPI()

    @app.get("/plain", responses=error_responses(429, 507))
    async def plain() -> dict[str, str]:
        return {}

    install_openapi(app)
    responses = app.openapi()["paths"]["/plain"]["get"]["responses"]
    assert set(responses) == {"200", "429", "500", "507"}
    for status in ("429", "507"):
        schema = responses[status]["content"]["application/json"]["schema"]
        assert schema == {"$ref": ERROR_REF}
    assert "ErrorInfo" in app.openapi()["components"]["schemas"]


async def test_upload_documents_its_multipart_body(app: FastAPI) -> None:
    op = app.openapi()["paths"]["/v1/adapters/{name}/versions"]["post"]
    body = op["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert body["required"] == ["files"]
    assert body["properties"]["files"]["items"]["format"] == "binary"
    assert set(body["properties"]) == {"files", "aliases", "notes"}


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_docs_pages_load_every_asset_from_the_registry(
        client: httpx.AsyncClient, page: str) -> None:
    html = await client.get(page)
    assert html.status_code == 200
    assert not re.findall(r"https?://", html.text), html.text
    urls = re.findall(r"""(?:src|href|url)\s*[=:]\s*['"]([^'"]+)['"]""", html.text)
    assets = [u for u in urls if u != "/openapi.json"]
    assert assets, html.text
    for url in urls:
        assert url.startswith("/"), f"{page} loads {url} from another host"
    for url in assets:
        response = await client.get(url)
        assert response.status_code == 200, url
        kind = response.headers["content-type"]
        assert kind.split(";")[0] in ("text/javascript", "application/javascript",
                                      "text/css", "image/png"), (url, kind)
        assert len(response.content) > 1000, url


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("PATCH", "/v1/adapters", "GET, POST"),
    ("PUT", "/v1/adapters/support-bot", "DELETE, GET, PATCH"),
    ("PATCH", "/v1/adapters/support-bot/aliases/live", "DELETE, PUT"),
])
async def test_method_not_allowed_lists_every_method_of_the_path(
        client: httpx.AsyncClient, method: str, path: str, allowed: str) -> None:
    response = await client.request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allowed
    assert response.json()["error"]["code"] == "method_not_allowed"
