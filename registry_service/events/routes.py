"""``/v1/events``: the audit log, and the public keys agents verify published events with."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from loraplane.api.bounds import INT64_MAX
from loraplane.api.events import EventKeyList
from registry_service.api.examples import EVENT_PAGE, json_example
from registry_service.deps import CtxDep, PrincipalDep, SessionDep
from registry_service.events.audit import read_events
from registry_service.events.schemas import DEFAULT_PAGE, MAX_PAGE, EventPage
from registry_service.events.signing import announced_keys

router = APIRouter(prefix="/v1/events", tags=["events"])


@router.get("", summary="Read the event log", responses=json_example(EVENT_PAGE))
async def get_events(
    session: SessionDep,
    principal: PrincipalDep,
    after: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
) -> EventPage:
    """The audit log of changes (versions published, aliases moved, tokens, routes, ...) the
    token may read, oldest first after the sequence `after`, `limit` at a time."""
    return await read_events(session, principal, after=after, limit=limit)


@router.get("/keys", summary="Event signing keys")
async def event_keys(ctx: CtxDep, _principal: PrincipalDep) -> EventKeyList:
    """The public keys agents verify published events with (any valid token)."""
    return announced_keys(ctx.settings, ctx.relay.signer)
