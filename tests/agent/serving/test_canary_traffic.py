"""An alias under canary, through the real proxy under uvicorn in front of a narrow fake
vLLM that fails the canary version: each side's requests, errors and first chunks
reach the tally and the metrics' ``track`` label."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from devharness.waiting import eventually
from inference_agent.metrics import AgentMetrics
from inference_agent.node.cache import AdapterCache
from inference_agent.node.materialize import Materializer
from inference_agent.node.vllm_client import VllmClient
from inference_agent.serving.leases import Leases
from inference_agent.serving.proxy import create_proxy_app
from inference_agent.serving.routes import CUSTOMER_HEADER, RouteTable
from inference_agent.serving.traffic import TrafficTally
from loraplane.canary_split import takes_canary
from loraplane.events import CanaryRoute, CanaryTraffic
from tests.agent.adapter_refs import FakeVllm, LocalFetch, adapter_ref
from tests.agent.proxy_harness import TENANT, TOKEN, bearer, inference_keys, serve_asgi

BASE = "tiny-llama"
CANARY_ID = 5
BROKEN = "bot@2"  # the canary version: the fake vLLM answers 500 for it


async def _events() -> AsyncIterator[bytes]:
    yield b'data: {"choices": [{"text": "hi"}]}\n\n'
    yield b"data: [DONE]\n\n"


async def completions(request: Request) -> Response:
    body = orjson.loads(await request.body())
    if body["model"] == BROKEN:
        return JSONResponse({"error": {"message": "broken"}}, status_code=500)
    if body.get("stream"):
        return StreamingResponse(_events(), media_type="text/event-stream")
    return JSONResponse({"model": body["model"], "choices": [{"text": "hi"}]})


@dataclass
class Rig:
    client: httpx.AsyncClient
    metrics: AgentMetrics
    tally: TrafficTally

    def sample(self, name: str, **labels: str) -> float:
        return sum(s.value for family in self.metrics.registry.collect()
                   for s in family.samples
                   if s.name == f"loraplane_agent_{name}" and labels.items() <= s.labels.items())

    def sides(self) -> dict[str, CanaryTraffic]:
        return {side.track: side for side in self.tally.snapshot({CANARY_ID})}


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    metrics, leases, routes, tally = AgentMetrics(), Leases(), RouteTable(BASE), TrafficTally()
    routes.set_owner("bot", TENANT)
    routes.set_alias("bot", "live", 1, adapter_ref(tmp_path, "bot", 1))
    routes.set_canary("bot", "live", CanaryRoute(id=CANARY_ID, weight=50,
                                                 target=adapter_ref(tmp_path, "bot", 2)))
    materializer = Materializer(tmp_path / "cache", max_bytes=10**9, fetch=LocalFetch(),
                                base_shapes=None, max_rank=16, metrics=metrics)
    cache = AdapterCache(cast(VllmClient, FakeVllm()), materializer, leases, capacity=2,
                         metrics=metrics, load_wait_timeout_s=5, is_routed=routes.is_routed)
    vllm_app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
    async with serve_asgi(vllm_app) as vllm_url:
        app = create_proxy_app(routes=routes, cache=cache, leases=leases, metrics=metrics,
                               vllm_url=vllm_url, base_model=BASE, registry=None,
                               keys=inference_keys(), tally=tally)
        async with serve_asgi(app) as url, httpx.AsyncClient(
                base_url=url, headers=bearer(TOKEN), timeout=30) as client:
            yield Rig(client, metrics, tally)


def customer(to_canary: bool) -> str:
    return next(c for c in (f"cust-{i}" for i in range(1000))
                if takes_canary(c, CANARY_ID, 50) == to_canary)


async def complete(rig: Rig, model: str, who: str, *, stream: bool = False) -> int:
    response = await rig.client.post(
        "/v1/completions", headers={CUSTOMER_HEADER: who},
        json={"model": model, "prompt": "hello", "max_tokens": 2, "stream": stream})
    return response.status_code


async def test_each_side_of_a_canary_counts_what_it_served(rig: Rig) -> None:
    stable, canary = customer(False), customer(True)
    assert await complete(rig, "bot", stable) == 200
    assert await complete(rig, "bot", stable, stream=True) == 200
    assert await complete(rig, "bot", canary) == 500
    assert await complete(rig, "bot@2", stable) == 500  # by version: no side

    def counted() -> dict[str, CanaryTraffic] | None:
        sides = rig.sides()
        done = sides.get("stable") is not None and sides["stable"].requests == 2
        return sides if done else None

    # A stream's end is counted as its last byte has gone: maybe after the client read it.
    sides = await eventually(counted, what="the stream's end counted")
    assert (sides["stable"].errors, sides["stable"].ttft[-1]) == (0, 1)
    assert (sides["canary"].requests, sides["canary"].errors) == (1, 1)
    assert sides["canary"].ttft[-1] == 0 and sides["canary"].latency[-1] == 1
    assert rig.sample("requests_total", adapter="bot", status="500", track="canary") == 1
    assert rig.sample("requests_total", adapter="bot", status="200", track="stable") == 2
    assert rig.sample("requests_total", adapter="bot", status="500", track="") == 1
    assert rig.sample("time_to_first_token_seconds_count", adapter="bot",
                      track="stable") == 1
    assert rig.sample("request_seconds_count", adapter="bot", track="canary") == 1
