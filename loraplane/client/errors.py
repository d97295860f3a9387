"""The client's errors: one base, ``RegistryError``, with retryable and terminal kinds.

httpx's exceptions and the registry's error bodies are mapped here, at the boundary,
so a caller asks one question (``error.retryable``) and never sees an httpx exception.
The registry answers every refusal with ``{"error": {"code", "message", "detail"}}``;
an answer without that shape (a proxy, a wrong URL) still becomes a clear error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

_BODY_SNIPPET = 300


class RegistryError(Exception):
    """Base of every error the client raises.

    ``status`` is the HTTP status (None when no answer came), ``code`` the registry's
    machine-readable reason (or one of the client's: ``unreachable``, ``timeout``...),
    ``detail`` its structured detail. ``retryable`` says whether the same call may
    succeed later.
    """

    retryable: bool = False
    default_code: str = "registry_error"

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None,
                 detail: Mapping[str, Any] | None = None, url: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code or self.default_code
        self.detail: dict[str, Any] = dict(detail or {})
        # The request's URL when an answer came; the registry's base URL when none did.
        self.url = url


class Unavailable(RegistryError):
    """The registry could not answer now: unreachable, too slow, overloaded or failing."""

    retryable = True
    default_code = "unavailable"


class Unreachable(Unavailable):
    default_code = "unreachable"


class TimedOut(Unavailable):
    default_code = "timeout"


class ServerError(Unavailable):
    """A 5xx answer."""


class RateLimited(Unavailable):
    """A 429 answer."""


class BadResponse(Unavailable):
    """A success whose body is not JSON or not the contract's shape.

    Retryable: it is what a half-deployed registry or a proxy in between answers.
    """

    default_code = "bad_response"


class DownloadFailed(Unavailable):
    """A file download broke off, was refused, or did not match its size or sha256."""

    default_code = "download_failed"


class Refused(RegistryError):
    """A 4xx answer: sending the same request again cannot help."""


class BadRequest(Refused):
    """400, 413, 422 and the other 4xx without a class of their own."""


class Unauthorized(Refused):
    """401: no token, or one the registry does not know."""


class Forbidden(Refused):
    """403: the token's role or tenant does not allow this."""


class NotFound(Refused):
    """404."""


class Conflict(Refused):
    """409: e.g. an alias no longer at ``expected_revision``, or a name already taken."""


class InvalidURL(RegistryError):
    """The registry URL (or a path built from it) is not a valid http(s) URL."""

    default_code = "invalid_url"


class InvalidSource(RegistryError):
    """A local folder or archive to push is not an adapter, or cannot be read."""

    default_code = "invalid_source"


_BY_STATUS: dict[int, type[RegistryError]] = {
    401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 429: RateLimited,
}


def status_error_type(status: int) -> type[RegistryError]:
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ServerError if status >= 500 else BadRequest


def _validation_summary(detail: Mapping[str, Any]) -> str:
    errors = detail.get("errors")
    if not isinstance(errors, list):
        return ""
    parts = []
    for item in errors:
        if isinstance(item, Mapping):
            loc = ".".join(str(p) for p in item.get("loc", []) if p != "body")
            parts.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", "")))
    return "; ".join(parts)


def error_from_response(response: httpx.Response) -> RegistryError:
    """The error for an answer of status >= 400, whether or not it has the registry's shape.

    The response body must have been read.
    """
    status, url = response.status_code, str(response.request.url)
    kind = status_error_type(status)
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        detail = error.get("detail")
        detail = detail if isinstance(detail, dict) else {}
        summary = _validation_summary(detail)
        message = f"{error['message']}: {summary}" if summary else error["message"]
        return kind(message, status=status, code=str(error.get("code") or f"http_{status}"),
                    detail=detail, url=url)
    text = response.text.strip()[:_BODY_SNIPPET]
    reason = response.reason_phrase or "error"
    message = f"HTTP {status} {reason} from {url}"
    return kind(f"{message}: {text}" if text else message, status=status, code=f"http_{status}",
                url=url)


def error_from_transport(base_url: str, exc: httpx.TransportError) -> RegistryError:
    """The error for a request that got no answer."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return Unreachable(f"cannot reach the registry at {base_url}: "
                           f"{exc or type(exc).__name__}", url=base_url)
    if isinstance(exc, httpx.TimeoutException):
        return TimedOut(f"the registry at {base_url} did not answer in time "
                        f"({type(exc).__name__})", url=base_url)
    if isinstance(exc, httpx.UnsupportedProtocol):
        return InvalidURL(f"invalid registry URL {base_url!r}: {exc}", url=base_url)
    return Unavailable(f"request to the registry at {base_url} failed: "
                       f"{exc or type(exc).__name__}", code="transport_error", url=base_url)
