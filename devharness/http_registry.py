"""The registry app served over real HTTP (uvicorn on a free port), in this event loop.

``running_registry`` talks to the app through ASGI; clients that must go through real
sockets (the Python client, the agent, a 307 to S3) use this.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

from devharness.registry import (
    ADMIN_TOKEN,
    RegistryHarness,
    registry_settings,
    reset_postgres,
)
from devharness.services import NatsService, PostgresDatabase, SeaweedS3
from loraplane.netutil import free_port
from registry_service.app import create_app


@dataclass
class Served:
    harness: RegistryHarness
    url: str
    admin_token: str = ADMIN_TOKEN


@asynccontextmanager
async def serve_http(backend: str, data_dir: Path, nats: NatsService,
                     pg: PostgresDatabase | None = None,
                     s3: SeaweedS3 | None = None) -> AsyncIterator[Served]:
    """A registry on ``backend``; ``postgres_s3`` needs ``pg`` (emptied here) and ``s3``."""
    if pg is not None:
        await reset_postgres(pg)
    settings = registry_settings(backend, data_dir, nats.url, pg, s3)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                               lifespan="off", log_level="warning"))
        task = asyncio.create_task(server.serve())
        while not server.started:
            assert not task.done(), "uvicorn exited before it started"
            await asyncio.sleep(0.02)
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport,
                                         base_url="http://registry") as client:
                harness = RegistryHarness(backend=backend, client=client, ctx=app.state.ctx,
                                          settings=settings, nats=nats, s3=s3)
                yield Served(harness, f"http://127.0.0.1:{port}")
        finally:
            server.should_exit = True
            await task
