"""OpenAI-style error bodies, and how the agent's errors map onto HTTP statuses.

Every refusal the front door makes looks like vLLM's and OpenAI's own:
``{"error": {"message", "type", "param", "code"}}``, so a client library that already
understands OpenAI errors understands ours.

Status choices:

- unknown adapter, alias or version: 404 ``model_not_found``;
- vLLM (or the registry, or a fetch) unreachable right now: 503, retry later;
- every loaded version busy (nothing evictable) for ``slot_wait_s``: 503
  ``capacity_exhausted`` with ``Retry-After``; the request's tenant already holding its
  share of the slots: 503 ``tenant_slots_full`` with ``Retry-After``;
- a body over ``max_body_bytes``: 413 ``body_too_large``; a body that is not a JSON
  object, or is nested too deep: 400 ``invalid_json`` / ``json_too_deep``;
- the version itself cannot be served here (our validation refused it, or vLLM refused
  to load it): 502 with the reason. It is the server side that is broken (a bad artifact
  behind a valid name), not the client's request, and retrying will not help until a
  different version is routed, so neither a 4xx nor a 503 fits; 502 says "the thing
  behind this gateway failed" and keeps the reason in the body;
- the agent is shutting down: 503 ``shutting_down`` with ``Retry-After``;
- no inference token, or an unknown or revoked one: 401 ``missing_api_key`` or
  ``invalid_api_key`` (type ``authentication_error``, as OpenAI answers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from starlette.responses import JSONResponse

from inference_agent.errors import (
    AdapterRejected,
    AgentError,
    CapacityExhausted,
    NotServable,
    RetryableError,
    VllmRefused,
)

# Long enough for a busy version to finish a short request, short enough not to stall.
CAPACITY_RETRY_AFTER_S = 1
SHUTDOWN_RETRY_AFTER_S = 1


@dataclass(frozen=True, slots=True)
class ProxyError:
    """One refusal: status, OpenAI ``type`` and ``code``, message and extra headers."""

    status: int
    message: str
    type: str
    code: str
    param: str | None = None
    retry_after: int | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, headers: Mapping[str, str] | None = None) -> JSONResponse:
        merged = {**dict(headers or {}), **dict(self.headers)}
        if self.retry_after is not None:
            merged["Retry-After"] = str(self.retry_after)
        return JSONResponse(self.body(), status_code=self.status, headers=merged)


def bad_request(message: str, *, code: str = "invalid_request", param: str | None = None
                ) -> ProxyError:
    return ProxyError(400, message, "invalid_request_error", code, param)


def body_too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"the request body is over {limit} bytes",
                      "invalid_request_error", "body_too_large")


def shutting_down() -> ProxyError:
    return ProxyError(503, "the agent is shutting down and takes no new requests",
                      "service_unavailable_error", "shutting_down",
                      retry_after=SHUTDOWN_RETRY_AFTER_S)


def vllm_unreachable(detail: str) -> ProxyError:
    return ProxyError(503, f"the model server is unavailable: {detail}",
                      "service_unavailable_error", "vllm_unavailable")


def from_agent_error(exc: AgentError) -> ProxyError:
    """Map an error raised while resolving or loading a version to its refusal."""
    if isinstance(exc, NotServable):
        return ProxyError(404, exc.message, "invalid_request_error", "model_not_found",
                          param="model")
    if isinstance(exc, CapacityExhausted):
        return ProxyError(503, exc.message, "service_unavailable_error", exc.code,
                          retry_after=CAPACITY_RETRY_AFTER_S)
    if isinstance(exc, AdapterRejected | VllmRefused):
        return ProxyError(502, f"this adapter version cannot be served: {exc.message}",
                          "server_error", exc.code)
    if isinstance(exc, RetryableError):
        return ProxyError(503, exc.message, "service_unavailable_error", exc.code)
    return ProxyError(502, exc.message, "server_error", exc.code)
