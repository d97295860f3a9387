"""``/v1/adapters/{name}/aliases/{alias}/canary`` and ``…/canaries``: start a canary,
read it, pause, resume, promote or abort it, and list the alias's canaries; each
route one call of ``service``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from registry_service.canaries import service
from registry_service.canaries.schemas import Canary, CanaryAction, CanaryList, CanaryStart
from registry_service.deps import CtxDep, PrincipalDep, SessionDep

router = APIRouter(prefix="/v1/adapters/{name}/aliases/{alias}", tags=["canaries"])


@router.post("/canary", status_code=201, summary="Start a canary")
async def start_canary(name: str, alias: str, body: CanaryStart, session: SessionDep,
                       principal: PrincipalDep, ctx: CtxDep) -> Canary:
    """Put `version` on `steps[0]` percent of the alias's traffic (publisher), after its
    `pre` webhook gates pass if it has any. 409 `canary_exists` if one runs; 422
    `canary_is_stable` for the version it serves, `webhook_host_not_allowed` for a gate
    whose host the registry may not call, `prometheus_not_configured` for an analysis
    that reads a Prometheus the registry was not given."""
    return await service.start(session, principal, name, alias, body,
                               webhook_hosts=ctx.settings.canary_webhook_hosts,
                               prometheus=ctx.settings.prometheus_url is not None)


@router.get("/canary", summary="The running canary")
async def get_canary(name: str, alias: str, session: SessionDep,
                     principal: PrincipalDep) -> Canary:
    """The alias's progressing or paused canary; 404 `no_canary` when none runs."""
    return await service.current(session, principal, name, alias)


@router.post("/canary/pause", summary="Pause the canary")
async def pause_canary(name: str, alias: str, session: SessionDep, principal: PrincipalDep,
                       body: CanaryAction | None = None) -> Canary:
    """Hold the canary at its weight until resumed (publisher)."""
    return await service.pause(session, principal, name, alias, body.reason if body else None)


@router.post("/canary/resume", summary="Resume the canary")
async def resume_canary(name: str, alias: str, session: SessionDep, principal: PrincipalDep,
                        body: CanaryAction | None = None) -> Canary:
    """Go on from a pause; the step's window starts again (publisher)."""
    return await service.resume(session, principal, name, alias, body.reason if body else None)


@router.post("/canary/promote", summary="Promote the canary now")
async def promote_canary(name: str, alias: str, session: SessionDep, principal: PrincipalDep,
                         body: CanaryAction | None = None) -> Canary:
    """Skip to 100 %: the alias moves to the canary version (publisher)."""
    return await service.promote(session, principal, name, alias,
                                 body.reason if body else None)


@router.post("/canary/abort", summary="Abort the canary")
async def abort_canary(name: str, alias: str, session: SessionDep, principal: PrincipalDep,
                       body: CanaryAction | None = None) -> Canary:
    """Weight 0 at once; the alias stays where it was (publisher)."""
    return await service.abort(session, principal, name, alias, body.reason if body else None)


@router.get("/canaries", summary="The alias's canaries")
async def list_canaries(name: str, alias: str, session: SessionDep, principal: PrincipalDep,
                        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                        cursor: str | None = None) -> CanaryList:
    """Every canary the alias ran, newest first; `next_cursor` fetches older ones."""
    return await service.history(session, principal, name, alias, limit, cursor)
