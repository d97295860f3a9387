from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response, status

from loraplane.api.bounds import INT32_MAX
from registry_service.auth import service
from registry_service.auth.schemas import (
    TokenCreate,
    TokenCreated,
    TokenList,
    token_created,
    token_out,
)
from registry_service.deps import PrincipalDep, SessionDep

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_token(body: TokenCreate, session: SessionDep,
                       principal: PrincipalDep) -> TokenCreated:
    created = await service.create_token(session, principal, name=body.name, role=body.role,
                                         tenant=body.tenant, agent_id=body.agent_id)
    return token_created(created.token, created.secret)


@router.get("")
async def list_tokens(session: SessionDep, principal: PrincipalDep,
                      include_revoked: bool = False) -> TokenList:
    tokens = await service.list_tokens(session, principal, include_revoked=include_revoked)
    return TokenList(tokens=[token_out(t) for t in tokens])


@router.delete("/{token_id}", status_code=status.HTTP_204_NO_CONTENT)
async def revoke_token(token_id: Annotated[int, Path(ge=1, le=INT32_MAX)], session: SessionDep,
                       principal: PrincipalDep) -> Response:
    await service.revoke_token(session, principal, token_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
