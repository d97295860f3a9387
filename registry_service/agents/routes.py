from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Response

from loraplane.api.agents import InferenceCredentials
from loraplane.api.tokens import AGENT_ID_PATTERN
from loraplane.events import AgentStatus
from registry_service.agents import service
from registry_service.agents.ingest import ReportIn
from registry_service.agents.schemas import AgentList, AgentOut, RolloutOut
from registry_service.api.json_body import json_body, openapi_body
from registry_service.auth import service as auth_service
from registry_service.deps import CtxDep, PrincipalDep, SessionDep, TokenDep

router = APIRouter(tags=["agents"])

AgentId = Annotated[str, Path(pattern=AGENT_ID_PATTERN)]
StaleAfter = Annotated[float | None, Query(gt=0, le=7 * 24 * 3600,
                                           description="seconds without a report before an "
                                                       "agent counts as stale (default: the "
                                                       "registry's agent_stale_after_s)")]


# Before any /v1/agents/{agent_id} route, so "credentials" is never taken for an id.
@router.get("/v1/agents/credentials", summary="Inference credentials")
async def inference_credentials(session: SessionDep,
                                principal: PrincipalDep) -> InferenceCredentials:
    """The sha256 and tenant of every live inference token (agent tokens only)."""
    return await auth_service.inference_credentials(session, principal)


Prefer = Annotated[str | None, Header(
    description="`return=minimal` (RFC 7240): answer 204 with no body; the report is "
                "stored the same way. Agents send it: echoing a report of hundreds of "
                "entries back to each of them cost both sides CPU at every push.")]
_MINIMAL: dict[int | str, dict[str, Any]] = {
    204: {"description": "Stored (asked for with `Prefer: return=minimal`)"}}


def wants_minimal(prefer: str | None) -> bool:
    return any(item.split(";", 1)[0].strip().lower() == "return=minimal"
               for item in (prefer or "").split(","))


# Parsed from the bytes by pydantic-core: every agent sends one at every push.
StatusBody = Annotated[AgentStatus, Depends(json_body(AgentStatus))]


@router.post("/v1/agents/{agent_id}/status", summary="Report an agent's status",
             response_model=AgentOut, responses=_MINIMAL,
             openapi_extra=openapi_body(AgentStatus))
async def report_status(agent_id: AgentId, body: StatusBody, token: TokenDep, ctx: CtxDep,
                        prefer: Prefer = None) -> AgentOut | Response:
    """An agent's report of what it serves: each version's tier (hot, warm, cold), failures with
    their reason, and whether it is leaving (agent token, for the id it is bound to). Stored in
    batches; answers 409 `stale_report` for a report older than the one held."""
    # Authenticated with the report's batch (agents/ingest.py), not a session of its own.
    stored = await ctx.reports.submit(ReportIn(token, agent_id, body))
    if wants_minimal(prefer):
        return Response(status_code=204, headers={"Preference-Applied": "return=minimal"})
    return stored


@router.delete("/v1/agents/{agent_id}/binding", summary="Free an agent id", status_code=204)
async def release_binding(agent_id: AgentId, session: SessionDep,
                          principal: PrincipalDep) -> Response:
    """Free the agent id from the revoked token bound to it (global admins): another
    agent token may then bind it by its first report."""
    await auth_service.release_agent_binding(session, principal, agent_id)
    return Response(status_code=204)


@router.get("/v1/agents", summary="List agents", response_model=AgentList)
async def list_agents(session: SessionDep, principal: PrincipalDep, ctx: CtxDep,
                      stale_after_s: StaleAfter = None,
                      base_model: str | None = None) -> Response:
    """Every agent that reported, with its last report, and whether it is stale (no report for
    `stale_after_s`); filter by `base_model`."""
    # Written off the loop (``service.list_agents_json``), so sent as it is.
    return Response(await service.list_agents_json(
        session, principal, stale_after_s=stale_after_s or ctx.settings.agent_stale_after_s,
        base_model=base_model), media_type="application/json")


@router.get("/v1/adapters/{name}/rollout", summary="An adapter's rollout")
async def adapter_rollout(name: str, session: SessionDep, principal: PrincipalDep,
                          ctx: CtxDep, stale_after_s: StaleAfter = None) -> RolloutOut:
    """For each alias of the adapter, which agents serve its version, which are still behind or
    failed (with the reason), which agents own it by placement, and each version's tier per
    agent."""
    return await service.adapter_rollout(
        session, principal, name,
        stale_after_s=stale_after_s or ctx.settings.agent_stale_after_s)
