"""``/v1/adapters/{name}/aliases``: move, remove and roll back an alias, and read its
history, each route one call of ``service``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from registry_service.aliases import service
from registry_service.aliases.schemas import (
    AliasHistory,
    AliasMoveRequest,
    AliasState,
    RollbackRequest,
)
from registry_service.deps import PrincipalDep, SessionDep

router = APIRouter(prefix="/v1/adapters/{name}/aliases", tags=["aliases"])


@router.put("/{alias}", summary="Move an alias (promote)")
async def put_alias(name: str, alias: str, body: AliasMoveRequest, session: SessionDep,
                    principal: PrincipalDep) -> AliasState:
    """Point the alias at a version, creating it if needed (publisher); the move is recorded in
    the alias's history. With `expected_revision`, a compare-and-set: 409 if the alias moved
    meanwhile. A canary running on the alias answers 409 `canary_running` unless
    `abort_canary`."""
    return await service.promote(session, principal, name, alias, body.version,
                                 body.expected_revision, abort_canary=body.abort_canary)


@router.delete("/{alias}", summary="Remove an alias")
async def delete_alias(name: str, alias: str, session: SessionDep, principal: PrincipalDep,
                       abort_canary: bool = False) -> AliasState:
    """Remove the alias (publisher); its moves stay in its history. Routing rules naming it stop
    resolving. A canary running on it answers 409 ``canary_running`` unless
    ``abort_canary=true``."""
    return await service.remove_alias(session, principal, name, alias,
                                      abort_canary=abort_canary)


@router.post("/{alias}/rollback", summary="Roll an alias back")
async def rollback_alias(name: str, alias: str, session: SessionDep, principal: PrincipalDep,
                         body: RollbackRequest | None = None) -> AliasState:
    """Undo the alias's latest move that no rollback has undone yet.

    Every move but a rollback is pushed on an undo stack and each rollback pops one,
    pointing the alias at the version it had before that move: after v1, v2, v3,
    rollbacks go to v2, then v1, then answer 409 ``no_previous_version``.
    """
    expected = body.expected_revision if body else None
    return await service.rollback(session, principal, name, alias, expected,
                                  abort_canary=body.abort_canary if body else False)


@router.get("/{alias}/history", summary="An alias's moves")
async def get_history(name: str, alias: str, session: SessionDep, principal: PrincipalDep,
                      limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                      cursor: str | None = None) -> AliasHistory:
    """The alias's moves, newest first; ``next_cursor`` (a revision) fetches the next
    ``limit`` as ``cursor``."""
    return await service.alias_history(session, principal, name, alias, limit, cursor)
