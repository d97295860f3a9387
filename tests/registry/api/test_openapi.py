"""The OpenAPI description and its docs pages: errors as answered, upload body, offline UI."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from loraplane.api.events import EventPage
from loraplane.events import AUDIT_ADAPTER, DesiredState
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
    assert set(body["properties"]) == {"files", "aliases", "notes", "allow_shape_change",
                                      "abort_canary"}


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


def _public_operations(app: FastAPI) -> list[tuple[str, str, dict[str, Any]]]:
    return list(_operations(app.openapi()))


def test_every_operation_has_a_summary_and_a_description(app: FastAPI) -> None:
    operations = _public_operations(app)
    assert len(operations) >= 30
    for path, method, op in operations:
        # FastAPI's own summary is the function's name in title case: it says nothing.
        generated = op["operationId"].split(f"_{path.strip('/').split('/')[0]}", 1)[0]
        assert op.get("summary"), (method, path)
        assert op["summary"] != generated.replace("_", " ").title(), (method, path)
        assert len(op.get("description", "")) >= 40, (method, path, op.get("description"))


def test_internal_routes_stay_out_of_the_description(app: FastAPI) -> None:
    paths = set(app.openapi()["paths"])
    internal = ("/ui", "/static", "/docs", "/redoc", "/dashboard")
    assert not [p for p in paths if p == "/" or p.startswith(internal)], paths
    assert all(p.startswith(("/v1/", "/healthz", "/readyz", "/metrics")) for p in paths), paths


def _resolve(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _free_form(schema: dict[str, Any], components: dict[str, Any], depth: int = 0) -> bool:
    """Whether ``schema`` holds a map of free keys, which docs pages show as property1."""
    schema = _resolve(schema, components)
    if depth > 8:
        return False
    if "additionalProperties" in schema and not schema.get("properties"):
        return True
    children = [*schema.get("properties", {}).values(), *schema.get("anyOf", ()),
                *schema.get("allOf", ()), *([schema["items"]] if "items" in schema else [])]
    return any(_free_form(child, components, depth + 1) for child in children)


def test_no_answer_leaves_its_example_to_the_docs_pages(app: FastAPI) -> None:
    schema = app.openapi()
    components = schema["components"]["schemas"]
    assert "property1" not in str(schema) and "additionalProp1" not in str(schema)
    for path, method, op in _operations(schema):
        for status, response in op["responses"].items():
            body = response.get("content", {}).get("application/json")
            if int(status) >= 400 or body is None or not _free_form(body["schema"], components):
                continue
            top = _resolve(body["schema"], components)
            assert "example" in body or "examples" in top, (method, path, status)


def test_the_examples_are_answers_the_models_accept(app: FastAPI) -> None:
    from registry_service.api.examples import DESIRED_STATE, EVENT_PAGE
    from registry_service.api.health import Health, Readiness

    schema = app.openapi()
    components = schema["components"]["schemas"]
    Health.model_validate(components["Health"]["examples"][0])
    for example in components["Readiness"]["examples"]:
        Readiness.model_validate(example)
    EventPage.model_validate(EVENT_PAGE)
    for event in EVENT_PAGE["events"]:
        AUDIT_ADAPTER.validate_python(event)
    DesiredState.model_validate(DESIRED_STATE)
    assert schema["paths"]["/v1/desired"]["get"]["responses"]["200"]["content"][
        "application/json"]["example"] == DESIRED_STATE


async def test_docs_assets_name_no_other_host(client: httpx.AsyncClient) -> None:
    redoc = await client.get("/static-offline-docs/redoc.standalone.js")
    assert redoc.status_code == 200
    assert b"cdn.redoc.ly" not in redoc.content  # its footer's logo came from there
    logo = await client.get("/static-offline-docs/logo.svg")
    assert logo.status_code == 200
    assert logo.headers["content-type"] == "image/svg+xml"
    swagger = await client.get("/docs")
    assert '"validatorUrl": null' in swagger.text  # else a badge from validator.swagger.io
    for page in ("/docs", "/redoc"):
        policy = (await client.get(page)).headers["content-security-policy"]
        assert "default-src 'self'" in policy and "http" not in policy, policy
