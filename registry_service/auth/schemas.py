"""The tokens API's bodies (the wire contract lives in the shared core), built from rows."""

from __future__ import annotations

from loraplane.api.tokens import TokenCreate, TokenCreated, TokenList, TokenOut
from registry_service.auth.models import ApiToken
from registry_service.auth.roles import Role

__all__ = ["TokenCreate", "TokenCreated", "TokenList", "TokenOut", "token_created",
           "token_out"]


def token_out(token: ApiToken) -> TokenOut:
    return TokenOut(id=token.id, name=token.name, role=Role(token.role),
                    tenant=token.tenant.name if token.tenant else None, prefix=token.prefix,
                    created_at=token.created_at, revoked_at=token.revoked_at,
                    agent_id=token.agent_id)


def token_created(token: ApiToken, secret: str) -> TokenCreated:
    return TokenCreated(**token_out(token).model_dump(), secret=secret)
