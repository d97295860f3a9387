"""Domain errors of the registry.

Services raise these; one handler (``registry_service.api.errors``) turns them into
``{"error": {"code", "message", "detail"}}`` responses. Errors of boto3, nats and the
database drivers are mapped to these at the boundary, so no route sees a driver error.
"""

from __future__ import annotations

from typing import Any


class RegistryError(Exception):
    """Base of every error the registry raises on purpose."""

    status: int = 500
    code: str = "internal_error"
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        detail: dict[str, Any] | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.detail: dict[str, Any] = detail or {}


class InvalidInput(RegistryError):
    """The request is well-formed HTTP but its content is refused (terminal)."""

    status = 422
    code = "invalid_input"


class BadRequest(RegistryError):
    status = 400
    code = "bad_request"


class PayloadTooLarge(RegistryError):
    status = 413
    code = "payload_too_large"


class NotFound(RegistryError):
    status = 404
    code = "not_found"


class Conflict(RegistryError):
    status = 409
    code = "conflict"


class Unauthorized(RegistryError):
    status = 401
    code = "unauthorized"


class Forbidden(RegistryError):
    status = 403
    code = "forbidden"


class TooManyRequests(RegistryError):
    """Too much in flight for this caller; the client may retry later."""

    status = 429
    code = "too_many_requests"
    retryable = True


class Unavailable(RegistryError):
    """A dependency (S3, NATS, the database) cannot be reached; try again later."""

    status = 503
    code = "unavailable"
    retryable = True


class InsufficientStorage(RegistryError):
    """The registry's own disk is full; the client may retry later."""

    status = 507
    code = "insufficient_storage"
    retryable = True


class BlobStoreFull(InsufficientStorage):
    """The blob store is out of space (a local disk or quota, an S3 server that says it
    is full): 507, not the 503 of an unreachable store."""


class LocalStorageError(RegistryError):
    """The registry's own disk failed otherwise; the client's input was not at fault."""

    status = 500
    code = "local_storage_error"


class BlobStoreUnavailable(Unavailable):
    code = "blob_store_unavailable"


class BlobNotFound(NotFound):
    code = "blob_not_found"


class EventBusUnavailable(Unavailable):
    code = "event_bus_unavailable"
