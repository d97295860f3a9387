from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response, status

from loraplane.api.bounds import INT32_MAX
from registry_service.auth import service
from registry_service.auth.schemas import (
    TokenCreate,
    TokenCreated,
    TokenList,
    TokenOut,
    token_created,
    token_out,
)
from registry_service.deps import PrincipalDep, SessionDep

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])
# Not under /v1/tokens: a word there would also match DELETE /v1/tokens/{token_id}.
whoami_router = APIRouter(prefix="/v1", tags=["tokens"])


@whoami_router.get("/whoami", summary="The calling token")
async def whoami(session: SessionDep, principal: PrincipalDep) -> TokenOut:
    """The calling token: name, role, tenant (``loraplane whoami``). Never its secret."""
    return token_out(await service.own_token(session, principal))


@router.post("", summary="Create a token", status_code=status.HTTP_201_CREATED)
async def create_token(body: TokenCreate, session: SessionDep,
                       principal: PrincipalDep) -> TokenCreated:
    """Make a bearer token with a role and a tenant (admin); the secret is in this answer only,
    the registry keeps its sha256. An `agent` token may be made for one `agent_id`."""
    created = await service.create_token(session, principal, name=body.name, role=body.role,
                                         tenant=body.tenant, agent_id=body.agent_id)
    return token_created(created.token, created.secret)


@router.get("", summary="List tokens")
async def list_tokens(session: SessionDep, principal: PrincipalDep,
                      include_revoked: bool = False) -> TokenList:
    """The tokens an admin may see: name, role, tenant, prefix, when made and revoked (never a
    secret); revoked ones with `include_revoked`."""
    tokens = await service.list_tokens(session, principal, include_revoked=include_revoked)
    return TokenList(tokens=[token_out(t) for t in tokens])


@router.delete("/{token_id}", summary="Revoke a token", status_code=status.HTTP_204_NO_CONTENT)
async def revoke_token(token_id: Annotated[int, Path(ge=1, le=INT32_MAX)], session: SessionDep,
                       principal: PrincipalDep) -> Response:
    """Revoke a token at once (admin); agents learn it from a `credentials_changed` event, or
    within seconds from their periodic read."""
    await service.revoke_token(session, principal, token_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
