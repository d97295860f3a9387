from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from loraplane.events import DesiredState
from registry_service.deps import CtxDep, PrincipalDep, SessionDep
from registry_service.desired.service import desired_state

router = APIRouter(prefix="/v1/desired", tags=["desired"])


@router.get("")
async def get_desired(
    session: SessionDep,
    principal: PrincipalDep,
    ctx: CtxDep,
    base_model: Annotated[str, Query(min_length=1, max_length=255)],
    adapter: Annotated[str | None, Query(max_length=63)] = None,
) -> DesiredState:
    return await desired_state(session, principal, base_model=base_model, adapter=adapter,
                               stale_after_s=ctx.settings.agent_stale_after_s)
