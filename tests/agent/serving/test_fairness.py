"""Tenants sharing an agent cannot starve each other of loaded-adapter slots (issue 35,
Medium 5): one tenant's requests in flight hold at most its share of the slots (503
``tenant_slots_full`` beyond), and a request that finds every slot held waits at most
``slot_wait_s`` (503 ``capacity_exhausted``), each with ``Retry-After``.

The proxy's real parts (route table, leases, cache, materializer) under uvicorn, in
front of a fake vLLM whose streams are held open until the test lets them end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from inference_agent.metrics import AgentMetrics
from inference_agent.node.cache import AdapterCache
from inference_agent.node.materialize import Materializer
from inference_agent.node.vllm_client import VllmClient
from inference_agent.serving.leases import Leases
from inference_agent.serving.proxy import create_proxy_app
from inference_agent.serving.routes import RouteTable
from inference_agent.settings import AgentSettings
from tests.agent.adapter_refs import FakeVllm, LocalFetch, adapter_ref
from tests.agent.proxy_harness import (
    OTHER_TENANT,
    OTHER_TOKEN,
    TENANT,
    TOKEN,
    bearer,
    inference_keys,
    serve_asgi,
)

BASE = "tiny-llama"
CAPACITY = 4
SLOT_WAIT_S = 0.5
# Without the bound a request would wait this long for a slot (the swap's wait).
LOAD_WAIT_S = 60.0


@dataclass
class HeldStreams:
    """vLLM's completions: a streamed one is held open until ``release`` is set."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    open: int = 0

    async def completions(self, request: Request) -> Response:
        if not json.loads(await request.body()).get("stream"):
            return JSONResponse({"choices": [{"text": "a"}]})

        async def events() -> AsyncIterator[bytes]:
            self.open += 1
            try:
                yield b'data: {"choices": [{"text": "a"}]}\n\n'
                await self.release.wait()
                yield b"data: [DONE]\n\n"
            finally:
                self.open -= 1

        return StreamingResponse(events(), media_type="text/event-stream")


@dataclass
class Rig:
    client: httpx.AsyncClient
    other: httpx.AsyncClient
    vllm: FakeVllm
    streams: HeldStreams
    cache: AdapterCache
    leases: Leases


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    vllm, metrics, leases, routes = FakeVllm(), AgentMetrics(), Leases(), RouteTable(BASE)
    materializer = Materializer(tmp_path / "cache", max_bytes=10**9, fetch=LocalFetch(),
                                base_shapes=None, max_rank=16, metrics=metrics)
    cache = AdapterCache(cast(VllmClient, vllm), materializer, leases, capacity=CAPACITY,
                         metrics=metrics, load_wait_timeout_s=LOAD_WAIT_S,
                         is_routed=routes.is_routed)
    for tenant, adapters in ((TENANT, ("a1", "a2", "a3", "a4")), (OTHER_TENANT, ("g1", "g2"))):
        for adapter in adapters:
            routes.set_owner(adapter, tenant)
            routes.set_alias(adapter, "live", 1, adapter_ref(tmp_path, adapter, 1))
    streams = HeldStreams()
    fake = Starlette(routes=[Route("/v1/completions", streams.completions, methods=["POST"])])
    share = AgentSettings(base_model=BASE, registry="http://registry", token="t",
                          max_loaded=CAPACITY).tenant_slots
    assert share == 3
    async with serve_asgi(fake) as vllm_url:
        app = create_proxy_app(routes=routes, cache=cache, leases=leases, metrics=metrics,
                               vllm_url=vllm_url, base_model=BASE, registry=None,
                               keys=inference_keys(), tenant_slots=share,
                               slot_wait_s=SLOT_WAIT_S)
        async with (serve_asgi(app) as url,
                    httpx.AsyncClient(base_url=url, headers=bearer(TOKEN),
                                      timeout=30) as client,
                    httpx.AsyncClient(base_url=url, headers=bearer(OTHER_TOKEN),
                                      timeout=30) as other):
            try:
                yield Rig(client, other, vllm, streams, cache, leases)
            finally:
                streams.release.set()


@contextlib.asynccontextmanager
async def held_stream(client: httpx.AsyncClient, model: str) -> AsyncIterator[None]:
    """A streamed completion of ``model``, started (its first event read), held open."""
    request = {"model": model, "prompt": "hi", "stream": True}
    async with client.stream("POST", "/v1/completions", json=request) as response:
        assert response.status_code == 200, await response.aread()
        chunks = response.aiter_bytes()
        assert b"data:" in await anext(chunks)
        yield


async def test_one_tenant_cannot_hold_every_slot(rig: Rig) -> None:
    async with contextlib.AsyncExitStack() as held:
        for model in ("a1", "a2", "a3"):
            await held.enter_async_context(held_stream(rig.client, model))
        assert rig.leases.held_by(TENANT) == 3
        # A fourth version of the same tenant would take the last slot: refused at once.
        refused = await rig.client.post("/v1/completions",
                                        json={"model": "a4", "prompt": "hi"})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "tenant_slots_full"
        assert refused.headers["retry-after"] == "1"
        assert "a4@1" not in rig.vllm.load_calls
        # One more request on a version it already holds takes no new slot.
        async with held_stream(rig.client, "a1"):
            assert rig.leases.held_by(TENANT) == 3
        # The other tenant's cold version finds the slot left free, without waiting.
        async with asyncio.timeout(SLOT_WAIT_S * 10):
            answer = await rig.other.post("/v1/completions",
                                          json={"model": "g1", "prompt": "hi"})
        assert answer.status_code == 200, answer.text
        assert rig.cache.is_active("g1@1")
    # Once a stream ends, the tenant's next version is served.
    rig.streams.release.set()
    answer = await rig.client.post("/v1/completions", json={"model": "a4", "prompt": "hi"})
    assert answer.status_code == 200, answer.text


async def test_a_request_waits_for_a_slot_at_most_slot_wait_s(rig: Rig) -> None:
    async with contextlib.AsyncExitStack() as held:
        for client, model in ((rig.client, "a1"), (rig.client, "a2"), (rig.client, "a3"),
                              (rig.other, "g1")):
            await held.enter_async_context(held_stream(client, model))
        assert len(rig.cache.loaded_names()) == CAPACITY
        loop = asyncio.get_running_loop()
        started = loop.time()
        # Every slot is held by a stream: refused after the bound, not after the
        # swap's minute (or the streams' end).
        async with asyncio.timeout(LOAD_WAIT_S / 2):
            answer = await rig.other.post("/v1/completions",
                                          json={"model": "g2", "prompt": "hi"})
        assert loop.time() - started >= SLOT_WAIT_S
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "capacity_exhausted"
        assert answer.headers["retry-after"] == "1"
        assert not rig.cache.is_active("g2@1")
        assert rig.streams.open == CAPACITY


async def test_a_request_joining_a_waiting_load_shortens_its_wait(rig: Rig,
                                                                   tmp_path: Path) -> None:
    """A load started by the control path (the swap's long wait) that a request joins
    gives up after the request's bound."""
    async with contextlib.AsyncExitStack() as held:
        for client, model in ((rig.client, "a1"), (rig.client, "a2"), (rig.client, "a3"),
                              (rig.other, "g1")):
            await held.enter_async_context(held_stream(client, model))
        ref = adapter_ref(tmp_path, "g2", 1)
        swap = asyncio.ensure_future(rig.cache.ensure_active(ref, record=False))
        answer = await rig.other.post("/v1/completions", json={"model": "g2", "prompt": "hi"})
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "capacity_exhausted"
        with pytest.raises(Exception, match="slots"):
            await asyncio.wait_for(swap, LOAD_WAIT_S / 2)


def test_bad_shares_are_refused() -> None:
    for share in (0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError):
            AgentSettings(base_model=BASE, registry="http://registry", token="t",
                          tenant_slot_share=share)
    one = AgentSettings(base_model=BASE, registry="http://registry", token="t",
                        max_loaded=1)
    assert one.tenant_slots == 1
    every = AgentSettings(base_model=BASE, registry="http://registry", token="t",
                          max_loaded=8, tenant_slot_share=1)
    assert every.tenant_slots == 8
