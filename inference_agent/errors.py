"""The agent's errors: one base, retryable and terminal kinds.

Errors of the HTTP clients (to vLLM, the registry, the blob store) and nats are mapped to
these at the boundary, so the reconciler only asks one question: retry, or give up on
this version?
"""

from __future__ import annotations

from typing import Any


class AgentError(Exception):
    """Base of every error the agent raises on purpose."""

    code: str = "agent_error"
    retryable: bool = False

    def __init__(self, message: str, *, code: str | None = None,
                 detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.detail: dict[str, Any] = detail or {}
        # Set once this failure is in ``failures_total``: the layers it passes through on
        # its way up (cache, swap, reconciler) must not count the same attempt again.
        self.counted = False


class RetryableError(AgentError):
    """Might work later: a dependency is down, busy or flaky."""

    code = "retryable"
    retryable = True


class TerminalError(AgentError):
    """Will not work for this version however often it is tried."""

    code = "terminal"


class VllmUnavailable(RetryableError):
    code = "vllm_unavailable"


class RegistryUnavailable(RetryableError):
    code = "registry_unavailable"


class EventBusUnavailable(RetryableError):
    code = "event_bus_unavailable"


class FetchFailed(RetryableError):
    """A download broke off or did not match its size or sha256 (S3 may heal)."""

    code = "fetch_failed"


class VllmRefused(TerminalError):
    """vLLM answered a load with an error about the adapter itself."""

    code = "vllm_refused"


class AdapterRejected(TerminalError):
    """Our own validation refused the version before vLLM saw it."""

    code = "adapter_rejected"


class NotServable(TerminalError):
    """A request names something this agent does not know (answers 404)."""

    code = "model_not_found"


class CapacityExhausted(RetryableError):
    """Every loaded version has requests in flight, so nothing can be evicted now."""

    code = "capacity_exhausted"


class TenantSlotsFull(CapacityExhausted):
    """A tenant's requests in flight already hold its share of the loaded-adapter
    slots; one more version of its own would take another tenant's."""

    code = "tenant_slots_full"
