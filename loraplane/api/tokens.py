"""API tokens: ``/v1/tokens`` (admin only)."""

from __future__ import annotations

import enum
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from loraplane.api.text import SafeName

# The agent ids the registry accepts (``/v1/agents/{agent_id}``).
AGENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,254}$"


class Role(enum.StrEnum):
    READER = "reader"
    PUBLISHER = "publisher"
    ADMIN = "admin"
    # Inference agents: read every tenant's desired state and blobs, report status.
    AGENT = "agent"
    # Inference clients of one tenant: call an agent's OpenAI API, nothing on the
    # registry's. Agents check them locally against hashes they load from the registry.
    INFERENCE = "inference"


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    name: SafeName = Field(min_length=1, max_length=255)
    role: Role
    tenant: str | None = Field(default=None, description="omit for a global token")
    agent_id: str | None = Field(
        default=None, pattern=AGENT_ID_PATTERN,
        description="agent role only: the one agent this token reports for; without it "
                    "the token is bound to the first agent id it reports as")


class TokenOut(BaseModel):
    """A token as listed: never its secret or hash, only the prefix that identifies it."""

    id: int
    name: str
    role: Role
    tenant: str | None
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    agent_id: str | None = Field(default=None, description="the agent an agent token "
                                                            "reports for, once bound")


class TokenCreated(TokenOut):
    secret: str = Field(description="the bearer token; shown only in this response")


class TokenList(BaseModel):
    tokens: list[TokenOut]
