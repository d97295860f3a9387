"""The one error body of the REST API: ``{"error": {"code", "message", "detail"}}``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ErrorInfo(BaseModel):
    code: str = Field(description="machine-readable reason, e.g. adapter_not_found")
    message: str = Field(description="what went wrong, for people")
    detail: dict[str, Any] = Field(description="structured facts about the error")


class ErrorBody(BaseModel):
    """Every 4xx and 5xx answer of the registry has this body."""

    error: ErrorInfo
