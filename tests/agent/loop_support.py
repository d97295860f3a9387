"""Helpers shared by the agent's tests."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from devharness.registry import RegistryHarness, registry_settings
from devharness.services import NatsService
from devharness.uploads import upload_dir
from devharness.waiting import eventually
from inference_agent.control.contract import Readiness, SwapResult
from inference_agent.errors import AgentError
from inference_agent.http_server import QuietServer
from inference_agent.service import Agent
from inference_agent.serving.routes import RouteTable
from inference_agent.settings import AgentSettings
from loraplane.events import CanaryRoute, RouteRule, VersionRef
from loraplane.netutil import free_port
from registry_service.app import create_app


async def one_loop_turn() -> None:
    """Let every callback the loop already has ready run before this returns.

    asyncio runs ready callbacks first in, first out, and this task's wake-up joins the
    end of that line: a task just created has taken its first step (up to its first
    wait), and a waiter woken before this call has run on. A number of loop turns, not a
    duration, so no load can make it too short.
    """
    await asyncio.sleep(0)


class FakeSwapper:
    """Records alias moves and applies them to a real RouteTable; fails on request."""

    def __init__(self, routes: RouteTable) -> None:
        self.routes = routes
        self.moves: list[tuple[str, str, int, int | None]] = []
        # (adapter, version) -> how far the reconciler asked the swap to take it.
        self.readiness: dict[tuple[str, int], Readiness] = {}
        self.errors: dict[tuple[str, int], AgentError] = {}
        self.recounts = 0

    async def recount_disk(self) -> None:
        self.recounts += 1

    async def apply(self, adapter: str, alias: str, revision: int,
                    target: VersionRef | None, ready: Readiness = "warm",
                    canary: CanaryRoute | None = None) -> SwapResult:
        self.moves.append((adapter, alias, revision, target.version if target else None))
        if target is not None:
            self.readiness[(adapter, target.version)] = ready
        if target is not None and (adapter, target.version) in self.errors:
            # A real swap raises a new error at every attempt; each is counted once.
            error = copy.copy(self.errors[(adapter, target.version)])
            error.counted = False
            raise error
        _rev, old = self.routes.alias(adapter, alias)
        flipped = self.routes.set_alias(adapter, alias, revision, target)
        if flipped:
            self.routes.set_canary(adapter, alias, canary)
        return SwapResult(adapter=adapter, alias=alias, old=old.version if old else None,
                          new=target.version if target else None, loaded=False,
                          flipped=flipped)

    def record(self, adapter: str, alias: str, revision: int, ref: VersionRef) -> None:
        self.routes.set_alias(adapter, alias, revision, ref)

    def drop_adapter(self, adapter: str) -> None:
        self.routes.drop_adapter(adapter)

    def set_rules(self, rules: list[RouteRule], keep: frozenset[str] = frozenset()) -> None:
        self.routes.set_rules(rules, keep)

    def set_rule(self, tenant: str, kind: str, key: str, rule: RouteRule | None) -> None:
        self.routes.set_rule(tenant, kind, key, rule)

    def set_owner(self, adapter: str, tenant: str) -> None:
        self.routes.set_owner(adapter, tenant)

    def draining(self) -> set[str]:
        return set()


class FakeCache:
    """The reconciler's view of the cache: records pins, loads and resyncs."""

    def __init__(self) -> None:
        self.pinned: set[str] = set()
        self.loaded: list[str] = []
        self.resyncs = 0

    def pin(self, adapter: str) -> None:
        self.pinned.add(adapter)

    def unpin(self, adapter: str) -> None:
        self.pinned.discard(adapter)

    def is_pinned(self, adapter: str) -> bool:
        return adapter in self.pinned

    def is_active(self, name: str) -> bool:
        return name in self.loaded

    async def ensure_active(self, target: VersionRef) -> str:
        name = f"{target.adapter}@{target.version}"
        self.loaded.append(name)
        return name

    async def resync(self) -> set[str]:
        self.resyncs += 1
        return {"lost@1"}


# --- a registry over real HTTP ------------------------------------------------------------


@dataclass
class ServedRegistry:
    """The registry app behind uvicorn on a free port, and an admin harness for it."""

    url: str
    harness: RegistryHarness

    async def agent_token(self) -> str:
        headers = await self.harness.token("agent")
        return headers["Authorization"].removeprefix("Bearer ")

    async def inference_token(self, tenant: str = "acme") -> tuple[int, str]:
        """A new inference token of ``tenant``: its id and its secret."""
        response = await self.harness.client.post(
            "/v1/tokens", json={"name": f"client-{tenant}", "role": "inference",
                                "tenant": tenant}, headers=self.harness.admin_headers)
        assert response.status_code == 201, response.text
        return int(response.json()["id"]), str(response.json()["secret"])

    async def revoke(self, token_id: int) -> None:
        response = await self.harness.client.delete(f"/v1/tokens/{token_id}",
                                                    headers=self.harness.admin_headers)
        assert response.status_code == 204, response.text

    async def publish(self, name: str, folder: Path, aliases: str = "live") -> int:
        response = await upload_dir(self.harness, name, folder, aliases=aliases)
        assert response.status_code == 201, response.text
        return int(response.json()["version"])

    async def put_route(self, kind: str, key: str, adapter: str, alias: str = "live") -> None:
        response = await self.harness.client.put(
            f"/v1/routes/{kind}/{key}", json={"adapter": adapter, "alias": alias},
            headers=self.harness.admin_headers)
        assert response.status_code == 200, response.text


@asynccontextmanager
async def serve_app(app: Any, port: int | None = None) -> AsyncIterator[str]:
    """Serve an ASGI app with uvicorn on 127.0.0.1; yields its base URL."""
    port = port or free_port()
    server = QuietServer(uvicorn.Config(app, host="127.0.0.1", port=port,
                                        log_level="warning", lifespan="on"))
    async with running(server):
        yield f"http://127.0.0.1:{port}"


@asynccontextmanager
async def running(server: QuietServer) -> AsyncIterator[asyncio.Task[None]]:
    """``server`` serving once it has started; told to exit and awaited afterwards."""
    task = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.started or task.done(), timeout_s=60,
                         what="uvicorn start", interval_s=0.02)
        if task.done():
            task.result()
            raise AssertionError("uvicorn stopped during start-up")
        yield task
    finally:
        server.should_exit = True
        await task


@asynccontextmanager
async def served_registry(tmp_path: Path, nats: NatsService,
                          port: int | None = None) -> AsyncIterator[ServedRegistry]:
    """The embedded registry (SQLite, local blobs) under ``tmp_path/registry``: serving it
    again with the same ``tmp_path`` and ``port`` is the same registry after a restart."""
    settings = registry_settings("embedded", tmp_path / "registry", nats.url, None, None)
    app = create_app(settings)
    async with serve_app(app, port) as url, \
            httpx.AsyncClient(base_url=url, timeout=60) as client:
        harness = RegistryHarness(backend="embedded", client=client, ctx=app.state.ctx,
                                  settings=settings, nats=nats, s3=None)
        yield ServedRegistry(url=url, harness=harness)


@asynccontextmanager
async def running_agent(settings: AgentSettings, *, ready_timeout_s: float = 120,
                        stop_timeout_s: float = 30) -> AsyncIterator[Agent]:
    """``Agent(settings)`` running in this loop, ready (its ``url`` set); stopped after."""
    agent = Agent(settings)
    run = asyncio.create_task(agent.run(install_signals=False))
    try:
        async with asyncio.timeout(ready_timeout_s):
            await agent.ready.wait()
        assert agent.url is not None
        yield agent
    finally:
        agent.stop()
        await asyncio.wait_for(run, stop_timeout_s)
