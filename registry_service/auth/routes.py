from __future__ import annotations

from fastapi import APIRouter, Response, status

from registry_service.auth import service
from registry_service.auth.schemas import TokenCreate, TokenCreated, TokenList, TokenOut
from registry_service.deps import PrincipalDep, SessionDep

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])


@router.post("", status_code=status.HTTP_201_CREATED)
async def create_token(body: TokenCreate, session: SessionDep,
                       principal: PrincipalDep) -> TokenCreated:
    created = await service.create_token(session, principal, name=body.name, role=body.role,
                                         tenant=body.tenant)
    return TokenCreated.of_new(created.token, created.secret)


@router.get("")
async def list_tokens(session: SessionDep, principal: PrincipalDep,
                      include_revoked: bool = False) -> TokenList:
    tokens = await service.list_tokens(session, principal, include_revoked=include_revoked)
    return TokenList(tokens=[TokenOut.of(t) for t in tokens])


@router.delete("/{token_id}", status_code=status.HTTP_204_NO_CONTENT)
async def revoke_token(token_id: int, session: SessionDep, principal: PrincipalDep) -> Response:
    await service.revoke_token(session, principal, token_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
