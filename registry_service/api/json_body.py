"""A JSON request body read by pydantic-core from its bytes, in one pass.

FastAPI reads a model body with the standard library's ``json.loads`` and then validates
the objects that made: two passes, and Python objects built only to be thrown away. An
agent's status report (hundreds of entries, from every agent of a fleet at every push)
is the body where that shows.
Why: docs/decisions.md#request-bodies-are-validated-from-their-bytes

The errors keep FastAPI's shape (``RequestValidationError``, each location under
``body``), so the one handler in ``api/errors.py`` answers them like any other, and the
OpenAPI description still shows the route's body (``openapi_body``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from email.message import Message
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def _is_json(content_type: str | None) -> bool:
    # As FastAPI decides: no Content-Type, application/json, or application/<x>+json.
    if not content_type:
        return True
    message = Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json"))


def _under_body(error: Any) -> dict[str, Any]:
    return {"loc": ("body", *error.get("loc", ())), "msg": error.get("msg", ""),
            "type": error.get("type", "")}


def json_body(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A dependency that returns the request's body as ``model``, or raises
    ``RequestValidationError`` (a 422 with every problem's location)."""

    async def parse(request: Request) -> M:
        if not _is_json(request.headers.get("content-type")):
            raise RequestValidationError([{
                "loc": ("body",), "type": "content_type",
                "msg": "the body must be JSON (Content-Type: application/json)"}])
        try:
            return model.model_validate_json(await request.body())
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_input=False)
            raise RequestValidationError([_under_body(e) for e in errors]) from None

    return parse


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` describing ``model`` as the required JSON body. The model must
    appear in the description elsewhere (a response), which puts it in its schemas."""
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": schema}}}}
