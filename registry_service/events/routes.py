from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from loraplane.api.bounds import INT64_MAX
from registry_service.deps import PrincipalDep, SessionDep
from registry_service.events.audit import read_events
from registry_service.events.schemas import DEFAULT_PAGE, MAX_PAGE, EventPage

router = APIRouter(prefix="/v1/events", tags=["events"])


@router.get("")
async def get_events(
    session: SessionDep,
    principal: PrincipalDep,
    after: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
) -> EventPage:
    return await read_events(session, principal, after=after, limit=limit)
