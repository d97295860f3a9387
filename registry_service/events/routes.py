from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from loraplane.api.bounds import INT64_MAX
from loraplane.api.events import EventKeyList
from registry_service.deps import CtxDep, PrincipalDep, SessionDep
from registry_service.events.audit import read_events
from registry_service.events.schemas import DEFAULT_PAGE, MAX_PAGE, EventPage
from registry_service.events.signing import announced_keys

router = APIRouter(prefix="/v1/events", tags=["events"])


@router.get("")
async def get_events(
    session: SessionDep,
    principal: PrincipalDep,
    after: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
) -> EventPage:
    return await read_events(session, principal, after=after, limit=limit)


@router.get("/keys")
async def event_keys(ctx: CtxDep, _principal: PrincipalDep) -> EventKeyList:
    """The public keys agents verify published events with (any valid token)."""
    return announced_keys(ctx.settings, ctx.relay.signer)
