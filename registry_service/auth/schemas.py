from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from registry_service.auth.models import ApiToken
from registry_service.auth.roles import Role


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    name: str = Field(min_length=1, max_length=255)
    role: Role
    tenant: str | None = Field(default=None, description="omit for a global token")


class TokenOut(BaseModel):
    """A token as listed: never its secret or hash, only the prefix that identifies it."""

    id: int
    name: str
    role: Role
    tenant: str | None
    prefix: str
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def of(cls, token: ApiToken) -> TokenOut:
        return cls(id=token.id, name=token.name, role=Role(token.role),
                   tenant=token.tenant.name if token.tenant else None, prefix=token.prefix,
                   created_at=token.created_at, revoked_at=token.revoked_at)


class TokenCreated(TokenOut):
    secret: str = Field(description="the bearer token; shown only in this response")

    @classmethod
    def of_new(cls, token: ApiToken, secret: str) -> TokenCreated:
        return cls(**TokenOut.of(token).model_dump(), secret=secret)


class TokenList(BaseModel):
    tokens: list[TokenOut]
