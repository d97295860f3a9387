"""``GET /v1/desired``: the snapshot an agent reconciles against before it follows the
stream."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from loraplane.events import DesiredState
from registry_service.api.examples import DESIRED_STATE, json_example
from registry_service.deps import CtxDep, PrincipalDep, SessionDep
from registry_service.desired.service import desired_state

router = APIRouter(prefix="/v1/desired", tags=["desired"])


@router.get("", summary="Desired state for agents", response_model=DesiredState,
            responses=json_example(DESIRED_STATE))
async def get_desired(
    session: SessionDep,
    principal: PrincipalDep,
    ctx: CtxDep,
    base_model: Annotated[str, Query(min_length=1, max_length=255)],
    adapter: Annotated[str | None, Query(max_length=63)] = None,
) -> JSONResponse:
    """What agents of `base_model` should serve: every adapter with its aliases, the versions
    they point at and their files, the routing rules, the placement and the live fleet, and the
    stream sequence the snapshot reflects. `adapter` narrows it to one adapter."""
    state = await desired_state(session, principal, base_model=base_model, adapter=adapter,
                                stale_after_s=ctx.settings.agent_stale_after_s)
    # Dumped here, not by FastAPI: ``FileRef.direct_url`` is excluded from every dump
    # (it must never reach a log or a stored row), so the linker adds the URLs to this
    # response's own copy, as the relay does to each published event. The caller may
    # read every adapter listed: what the file route checks before its 307 to S3.
    payload = state.model_dump(mode="json")
    if ctx.file_linker is not None:
        payload = await ctx.file_linker.link_snapshot(payload)
    return JSONResponse(payload)
