"""FastAPI dependencies: context, one session per request, the authenticated principal."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncSession

from registry_service.auth.roles import Principal
from registry_service.auth.service import authenticate
from registry_service.context import RegistryContext


# Dependencies are async even where they never await: FastAPI runs a plain function
# in its thread pool, a hand-off to a thread and back on every request.
async def get_ctx(request: Request) -> RegistryContext:
    ctx: RegistryContext = request.app.state.ctx
    return ctx


CtxDep = Annotated[RegistryContext, Depends(get_ctx)]


async def get_session(ctx: CtxDep) -> AsyncIterator[AsyncSession]:
    async with ctx.db.session() as session:
        yield session


SessionDep = Annotated[AsyncSession, Depends(get_session)]

_bearer = HTTPBearer(auto_error=False)


async def get_token(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str | None:
    return credentials.credentials if credentials else None


TokenDep = Annotated[str | None, Depends(get_token)]


async def get_principal(ctx: CtxDep, token: TokenDep) -> Principal:
    # Its own short session: authentication is not part of the use case's transaction.
    async with ctx.db.session() as session:
        return await authenticate(session, token)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


async def get_reader(session: SessionDep, token: TokenDep) -> Principal:
    # For reads answered whole from the request's session: authenticating in it spares
    # a second connection, its ping and its transaction. Not for a streamed answer: it
    # would hold that transaction open while it streams.
    return await authenticate(session, token)


ReaderDep = Annotated[Principal, Depends(get_reader)]
