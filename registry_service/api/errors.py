"""The one place where errors become HTTP responses.

Every error body has one shape: ``{"error": {"code", "message", "detail"}}``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from loraplane.lora.errors import AdapterInvalid
from loraplane.naming import explain_slug_error
from registry_service.errors import RegistryError

log = logging.getLogger(__name__)

_HTTP_CODES = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 409: "conflict", 413: "payload_too_large",
    415: "unsupported_media_type", 422: "invalid_request", 429: "too_many_requests",
}


def error_response(status: int, code: str, message: str,
                   detail: dict[str, Any] | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = {"error": {"code": code, "message": message, "detail": detail or {}}}
    return JSONResponse(body, status_code=status, headers=headers)


async def _registry_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RegistryError)
    if exc.status >= 500:
        log.warning("%s: %s %s", exc.code, exc.message, exc.detail)
    headers = {"Retry-After": "5"} if exc.retryable else None
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else headers
    return error_response(exc.status, exc.code, exc.message, exc.detail, headers)


async def _adapter_invalid(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AdapterInvalid)
    return error_response(413 if exc.too_large else 422, exc.code, exc.message, exc.detail)


async def _validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": [str(p) for p in e.get("loc", ())],
         "msg": explain_slug_error(str(e.get("msg", "")))}
        for e in exc.errors()
    ]
    return error_response(422, "invalid_request", "the request is invalid", {"errors": errors})


_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


def _allowed_methods(request: Request) -> str:
    # Starlette's 405 names the methods of the first route whose path matched; each
    # method is a route of its own here, so ``Allow`` must gather them all. Included
    # routers are matched, not walked: their routes are not public.
    routes = request.app.router.routes
    allowed = [method for method in _METHODS
               if any(route.matches({**request.scope, "method": method})[0] == Match.FULL
                      for route in routes)]
    return ", ".join(allowed)


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and isinstance(exc.__cause__, RecursionError):
        # FastAPI's json.loads of a body nested deeper than Python's recursion limit;
        # its own 400 says only "There was an error parsing the body".
        return error_response(400, "json_too_deep",
                              "the request body is nested too deeply to be read as JSON")
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    headers = exc.headers
    if exc.status_code == 405:
        headers = {**(headers or {}), "Allow": _allowed_methods(request)}
    return error_response(exc.status_code, code, str(exc.detail), headers=headers)


async def _unhandled(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return error_response(500, "internal_error", "an internal error occurred")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RegistryError, _registry_error)
    app.add_exception_handler(AdapterInvalid, _adapter_invalid)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unhandled)
