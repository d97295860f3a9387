"""Liveness, readiness and metrics."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict
from sqlalchemy import text

from registry_service.agents.convergence import render_metrics
from registry_service.canaries.gauges import refresh_canary_metrics
from registry_service.deps import CtxDep
from registry_service.errors import RegistryError

router = APIRouter(tags=["health"])


class Health(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"status": "ok"}]})

    status: Literal["ok"]


@router.get("/healthz", summary="Liveness")
async def healthz() -> Health:
    """Answers while the process serves HTTP; checks nothing else. No token."""
    return Health(status="ok")


class Readiness(BaseModel):
    # An example, or the docs pages would invent one for the free-form ``checks``.
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"status": "ready", "checks": {"database": "ok", "blob_store": "ok",
                                       "event_bus": "ok"}},
        {"status": "unready", "checks": {"database": "database_unavailable",
                                         "blob_store": "ok", "event_bus": "disconnected"}},
    ]})

    status: Literal["ready", "unready"]
    checks: dict[str, str]


@router.get("/readyz", summary="Readiness", response_model=Readiness,
            responses={503: {"model": Readiness, "description": "a dependency is down"}})
async def readyz(ctx: CtxDep) -> JSONResponse:
    """Whether the registry can take work: `database` and `blob_store` must be `ok` (else 503);
    `event_bus` (a NATS ping) is reported but does not make it unready, the outbox keeps the
    events. No token."""
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


@router.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition"}})
async def metrics(ctx: CtxDep) -> Response:
    """The registry's metrics in Prometheus' text format, all prefixed `loraplane_registry_`
    (docs/metrics.md). No token: keep the port inside the cluster."""
    await ctx.fleet_gauges.refresh()
    await refresh_canary_metrics(ctx.db, ctx.metrics)
    return Response(await asyncio.to_thread(render_metrics, ctx.metrics),
                    media_type=CONTENT_TYPE_LATEST)
