"""A typed Python client for the registry's REST API, sync and async.

    from pathlib import Path

    from loraplane.client import RegistryClient

    with RegistryClient("http://127.0.0.1:8080", token) as registry:
        registry.create_adapter("support-bot", "meta-llama/Llama-3.1-8B-Instruct")
        result = registry.push("support-bot", Path("out/adapter"), aliases=["canary"])
        registry.move_alias("support-bot", "live", result.version)  # promote

``AsyncRegistryClient`` has the same methods, awaited. Answers are the pydantic models
of ``loraplane.api`` and ``loraplane.events``, the contract the registry declares its
routes with. Every failure is a ``RegistryError``; ``error.retryable`` says whether the
same call may work later.
"""

from __future__ import annotations

from loraplane.client._core import DEFAULT_TIMEOUT_S, path
from loraplane.client.aio import AsyncRegistryClient
from loraplane.client.errors import (
    BadRequest,
    BadResponse,
    Conflict,
    DownloadFailed,
    Forbidden,
    InvalidSource,
    InvalidURL,
    NotFound,
    RateLimited,
    Refused,
    RegistryError,
    ServerError,
    TimedOut,
    Unauthorized,
    Unavailable,
    Unreachable,
)
from loraplane.client.multipart import ADAPTER_FILES, FieldPart, FilePart, MultipartBody
from loraplane.client.sync import RegistryClient

__all__ = [
    "ADAPTER_FILES", "DEFAULT_TIMEOUT_S", "AsyncRegistryClient", "BadRequest", "BadResponse",
    "Conflict", "DownloadFailed", "FieldPart", "FilePart", "Forbidden", "InvalidSource",
    "InvalidURL", "MultipartBody", "NotFound", "RateLimited", "Refused", "RegistryClient",
    "RegistryError", "ServerError", "TimedOut", "Unauthorized", "Unavailable", "Unreachable",
    "path",
]
