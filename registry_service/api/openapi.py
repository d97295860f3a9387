"""The error responses of the OpenAPI description, written from one table.

Every refusal has the body of ``loraplane.api.ErrorBody`` (the one handler in
``registry_service.api.errors`` writes it), so no route lists its errors by hand: each
status has one entry in ``ERROR_STATUSES`` saying which operations can answer it,
judged from the operation itself (does it need a token, take a path parameter, a body,
a multipart upload?). A route whose errors the rules do not cover declares them with
``responses=error_responses(...)``. A new status raised by a domain error needs one
entry here; ``tests/registry/api/test_openapi.py`` checks that every status of
``registry_service.errors`` has one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from loraplane.api.errors import ErrorBody

Operation = dict[str, Any]
_ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}
_WRITES = ("post", "put", "patch", "delete")
# FastAPI describes its validation errors with these; the registry never answers them.
_FASTAPI_VALIDATION = ("HTTPValidationError", "ValidationError")


def _always(_: str, __: Operation) -> bool:
    return True


def _secured(_: str, op: Operation) -> bool:
    return bool(op.get("security"))


def _has_path_params(_: str, op: Operation) -> bool:
    return any(p.get("in") == "path" for p in op.get("parameters", ()))


def _has_body(_: str, op: Operation) -> bool:
    return "requestBody" in op


def _takes_input(method: str, op: Operation) -> bool:
    return _has_body(method, op) or any(p.get("in") == "query" for p in op.get("parameters", ()))


def _validated(method: str, op: Operation) -> bool:
    return _has_body(method, op) or bool(op.get("parameters")) or _secured(method, op)


def _secured_write(method: str, op: Operation) -> bool:
    return _secured(method, op) and method in _WRITES


def _uploads(_: str, op: Operation) -> bool:
    return "multipart/form-data" in op.get("requestBody", {}).get("content", {})


@dataclass(frozen=True, slots=True)
class ErrorStatus:
    description: str
    applies: Callable[[str, Operation], bool]
    headers: tuple[str, ...] = ()


_RETRY = ("Retry-After",)

ERROR_STATUSES: dict[int, ErrorStatus] = {
    400: ErrorStatus("The request is malformed: a bad cursor, a missing tenant, a body "
                     "that is not what the operation takes.", _takes_input),
    401: ErrorStatus("No bearer token, or one that is unknown or revoked.", _secured,
                     ("WWW-Authenticate",)),
    403: ErrorStatus("The token's role or tenant does not allow this.", _secured),
    404: ErrorStatus("A resource the path names does not exist (or is not visible to the "
                     "token).", _has_path_params),
    409: ErrorStatus("The change conflicts with the current state (it already exists, "
                     "or a revision moved on).", _secured_write),
    413: ErrorStatus("The body, a file or a field is over its limit: `body_too_large` (a "
                     "JSON body over `max_json_body_bytes`, refused before it is read), "
                     "`upload_too_large`, `file_too_large`, `archive_too_large`, "
                     "`archive_expansion_ratio`, ...", _has_body),
    422: ErrorStatus("A parameter or the body is invalid; detail says which.", _validated),
    429: ErrorStatus("`too_many_uploads`: this token has `max_uploads_per_token` uploads "
                     "in flight; retry later.", _uploads, _RETRY),
    500: ErrorStatus("An internal error; the body says no more than that.", _always),
    503: ErrorStatus("The database, the blob store or the event bus cannot be reached; "
                     "retry later.", _secured, _RETRY),
    507: ErrorStatus("`insufficient_storage`: the registry's disk or its blob store is "
                     "full; retry later.", _uploads, _RETRY),
}


def _response(status: int) -> dict[str, Any]:
    entry = ERROR_STATUSES[status]
    response: dict[str, Any] = {"description": entry.description,
                                "content": {"application/json": {"schema": _ERROR_REF}}}
    if entry.headers:
        response["headers"] = {name: {"schema": {"type": "string"}} for name in entry.headers}
    return response


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """Errors a route answers beyond what ``ERROR_STATUSES`` judges from its operation."""
    return {status: {"model": ErrorBody, "description": ERROR_STATUSES[status].description}
            for status in statuses}


def _is_fastapi_validation(response: dict[str, Any]) -> bool:
    schema = response.get("content", {}).get("application/json", {}).get("schema", {})
    return str(schema.get("$ref", "")).endswith("/HTTPValidationError")


def document_errors(schema: dict[str, Any]) -> None:
    """Give every operation of ``schema`` the error responses it can answer."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in _FASTAPI_VALIDATION:
        components.pop(name, None)
    body = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(body.pop("$defs", {}))
    components["ErrorBody"] = body
    for path_item in schema.get("paths", {}).values():
        for method, op in path_item.items():
            responses = op.setdefault("responses", {})
            for status, entry in ERROR_STATUSES.items():
                current = responses.get(str(status))
                missing = current is None and entry.applies(method, op)
                if missing or (current is not None and _is_fastapi_validation(current)):
                    responses[str(status)] = _response(status)


def install_openapi(app: FastAPI) -> None:
    """Make ``app`` describe its errors as the registry answers them."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document_errors(build())
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
