"""Liveness, readiness and metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from sqlalchemy import text

from registry_service.agents.convergence import refresh_fleet_metrics
from registry_service.deps import CtxDep
from registry_service.errors import RegistryError

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


class Readiness(BaseModel):
    status: str
    checks: dict[str, str]


@router.get("/readyz", response_model=Readiness,
            responses={503: {"model": Readiness, "description": "a dependency is down"}})
async def readyz(ctx: CtxDep) -> JSONResponse:
    checks: dict[str, Any] = {}
    try:
        async with ctx.db.session() as session:
            await session.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except RegistryError as exc:
        checks["database"] = exc.code
    try:
        await ctx.blobs.check()
        checks["blob_store"] = "ok"
    except RegistryError as exc:
        checks["blob_store"] = exc.code
    # An unreachable NATS does not stop uploads (the outbox keeps them), so it is
    # reported but does not make the registry unready.
    # A ping, not the client's flag: that stays up for a frozen or cut-off NATS.
    checks["event_bus"] = await ctx.relay.bus_state()
    ready = checks["database"] == "ok" and checks["blob_store"] == "ok"
    return JSONResponse({"status": "ready" if ready else "unready", "checks": checks},
                        status_code=200 if ready else 503)


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition"}})
async def metrics(ctx: CtxDep) -> Response:
    await refresh_fleet_metrics(ctx.db, ctx.metrics, ctx.settings.agent_stale_after_s)
    return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)
