"""A version vLLM lost (restart, unload by hand) while the cache believed it loaded:
the request loads it again and retries once, and only queues the full comparison with
vLLM for the control loop. The proxy's real parts, with a narrow fake vLLM served over
real HTTP (tests/agent/serving/test_proxy.py covers the same against real vLLM)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from inference_agent.metrics import AgentMetrics
from inference_agent.node.cache import AdapterCache
from inference_agent.node.materialize import Materializer
from inference_agent.node.vllm_client import VllmClient
from inference_agent.serving.leases import Leases
from inference_agent.serving.proxy import create_proxy_app
from inference_agent.serving.routes import RouteTable
from tests.agent.adapter_refs import FakeVllm, LocalFetch, adapter_ref
from tests.agent.proxy_harness import TENANT, TOKEN, bearer, inference_keys, serve_asgi

BASE = "tiny-llama"


@dataclass
class Rig:
    client: httpx.AsyncClient
    vllm: FakeVllm
    cache: AdapterCache
    routes: RouteTable
    resyncs: list[str]


def completions(vllm: FakeVllm) -> Starlette:
    """vLLM's /v1/completions: 404 for a name it has not loaded, as vLLM answers."""
    async def handle(request: Request) -> JSONResponse:
        model = json.loads(await request.body())["model"]
        if model != BASE and model not in vllm.names:
            return JSONResponse({"error": {
                "message": f"The model `{model}` does not exist.", "code": 404}}, 404)
        return JSONResponse({"model": model, "choices": [{"text": "hi"}]})
    return Starlette(routes=[Route("/v1/completions", handle, methods=["POST"])])


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    vllm, metrics, leases, routes = FakeVllm(), AgentMetrics(), Leases(), RouteTable(BASE)
    materializer = Materializer(tmp_path / "cache", max_bytes=10**9, fetch=LocalFetch(),
                                base_shapes=None, max_rank=16, metrics=metrics)
    cache = AdapterCache(cast(VllmClient, vllm), materializer, leases, capacity=4,
                         metrics=metrics, load_wait_timeout_s=1, is_routed=routes.is_routed)
    resyncs: list[str] = []
    async with serve_asgi(completions(vllm)) as vllm_url:
        app = create_proxy_app(routes=routes, cache=cache, leases=leases, metrics=metrics,
                               vllm_url=vllm_url, base_model=BASE, registry=None,
                               keys=inference_keys(),
                               request_resync=lambda: resyncs.append("vllm"))
        async with serve_asgi(app) as url, httpx.AsyncClient(
                base_url=url, headers=bearer(TOKEN)) as client:
            yield Rig(client, vllm, cache, routes, resyncs)


async def test_a_lost_version_is_loaded_again_and_the_resync_is_queued(
        rig: Rig, tmp_path: Path) -> None:
    for adapter in ("bot", "other"):
        rig.routes.set_owner(adapter, TENANT)
        rig.routes.set_alias(adapter, "live", 1, adapter_ref(tmp_path, adapter, 1))
        response = await rig.client.post("/v1/completions", json={"model": adapter})
        assert response.status_code == 200, response.text
    # vLLM restarted: it lost both versions, and the cache still believes them loaded.
    rig.vllm.names.clear()
    response = await rig.client.post("/v1/completions", json={"model": "bot"})
    assert response.status_code == 200, response.text
    assert response.headers["x-loraplane-adapter"] == "bot@1"
    assert rig.vllm.load_calls == ["bot@1", "other@1", "bot@1"]
    # The request did only its own version's work; the rest is queued for the loop.
    assert rig.resyncs == ["vllm"]
    assert rig.cache.is_active("other@1"), "the full resync is not the request's work"
    assert rig.cache.loaded_names() == ["other@1", "bot@1"]


async def test_a_version_that_cannot_load_again_is_refused(rig: Rig, tmp_path: Path) -> None:
    rig.routes.set_owner("bot", TENANT)
    rig.routes.set_alias("bot", "live", 1, adapter_ref(tmp_path, "bot", 1))
    assert (await rig.client.post("/v1/completions", json={"model": "bot"})).is_success
    rig.vllm.names.clear()
    rig.vllm.refuse.add("bot@1")
    response = await rig.client.post("/v1/completions", json={"model": "bot"})
    assert response.status_code == 502, response.text
    assert response.json()["error"]["code"] == "vllm_refused"
    assert rig.resyncs == ["vllm"] and not rig.cache.is_active("bot@1")
