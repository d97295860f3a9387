"""``/ui``: the page, its static files, its JSON endpoints and its live stream.

The page sends the registry token as a bearer header on every call, like any client:
the endpoints use the usual authentication and tenant scoping, and no cookie is set.
"""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path as FilePath
from typing import Annotated

import anyio
from fastapi import APIRouter, FastAPI, Path, Query
from fastapi.responses import FileResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from loraplane.api.bounds import INT32_MAX
from registry_service.auth.roles import Role
from registry_service.context import RegistryContext
from registry_service.deps import CtxDep, PrincipalDep, SessionDep, TokenDep
from registry_service.ui import service
from registry_service.ui.schemas import (
    Fleet,
    RunningCanaries,
    SignedIn,
    Timeline,
    VersionDetails,
    VersionDiff,
)
from registry_service.ui.stream import StreamHub, open_stream

STATIC = FilePath(__file__).parent / "static"
# The page may load and call nothing but this registry.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
}

class LiveResponse(StreamingResponse):
    """A stream that ends as soon as its client goes, not at its next write: under
    ASGI 2.4 Starlette notices a gone client only when a send fails, and an idle page is
    sent a ping only every 15 s, all that time holding one of its token's streams."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:

            async def stream() -> None:
                with suppress(OSError):  # the client went while a frame was on its way
                    await self.stream_response(send)
                group.cancel_scope.cancel()

            group.start_soon(stream)
            await self.listen_for_disconnect(receive)
            group.cancel_scope.cancel()


VersionPath = Annotated[int, Path(ge=1, le=INT32_MAX)]
VersionQuery = Annotated[int, Query(ge=1, le=INT32_MAX)]

pages = APIRouter(include_in_schema=False)
# The page's own JSON, not part of the registry's public API (nor of its OpenAPI).
api = APIRouter(prefix="/ui/api", tags=["ui"], include_in_schema=False)


@pages.get("/")
@pages.get("/dashboard")
async def to_ui() -> RedirectResponse:
    return RedirectResponse("/ui", status_code=307)


@pages.get("/ui")
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers=_PAGE_HEADERS)


@api.get("/session")
async def get_session(principal: PrincipalDep) -> SignedIn:
    """Who the token is; the page's sign-in checks the token with it."""
    return service.signed_in(principal)


@api.get("/adapters/{name}/timeline")
async def get_timeline(name: str, session: SessionDep, principal: PrincipalDep,
                       limit: Annotated[int, Query(ge=1, le=1000)] = 200) -> Timeline:
    return await service.timeline(session, principal, name, limit)


@api.get("/adapters/{name}/versions/{version}")
async def get_version_details(name: str, version: VersionPath, ctx: CtxDep,
                              session: SessionDep, principal: PrincipalDep) -> VersionDetails:
    return await service.version_details(session, principal, ctx.blobs, name, version)


@api.get("/adapters/{name}/diff")
async def get_version_diff(name: str, base: VersionQuery, head: VersionQuery, ctx: CtxDep,
                           session: SessionDep, principal: PrincipalDep) -> VersionDiff:
    """What changed from version ``base`` to version ``head``."""
    return await service.version_diff(session, principal, ctx.blobs, name, base, head)


@api.get("/fleet", response_model=Fleet)
async def get_fleet(ctx: CtxDep, session: SessionDep, principal: PrincipalDep) -> Response:
    # Written off the loop (``service.fleet``), so sent as it is.
    return Response(await service.fleet(session, principal,
                                        stale_after_s=ctx.settings.agent_stale_after_s),
                    media_type="application/json")


@api.get("/canaries")
async def get_canaries(session: SessionDep, principal: PrincipalDep) -> RunningCanaries:
    """The running canaries of the adapters the token may read. The page acts on them
    through the canary routes (``POST /v1/adapters/…/canary/{verb}``), not through /ui."""
    return await service.running_canaries(session, principal)


@api.get("/stream")
async def stream(ctx: CtxDep, principal: PrincipalDep, token: TokenDep) -> StreamingResponse:
    # ``principal`` refuses a bad token with the usual 4xx before the stream starts.
    principal.require(Role.READER)
    updates = open_stream(stream_hub(ctx), token,
                          max_per_token=ctx.settings.ui_max_streams_per_token)
    return LiveResponse(updates, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def stream_hub(ctx: RegistryContext) -> StreamHub:
    """The process's one hub of live streams, made at the first stream."""
    if ctx.ui_streams is None:
        ctx.ui_streams = StreamHub(ctx.db, interval_s=ctx.settings.ui_poll_interval_s,
                                   stale_after_s=ctx.settings.agent_stale_after_s)
    return ctx.ui_streams


def install_ui(app: FastAPI) -> None:
    app.include_router(pages)
    app.include_router(api)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")
