"""A generation request's token is checked from its headers before its body is read,
and every body is bounded (issue 35, High 3), and a body nested too deep is a 400, not
a 500 (Medium 14). The proxy's real parts under uvicorn with the agent's connection
protocol, in front of a narrow fake vLLM."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

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
from tests.agent.adapter_refs import FakeVllm, LocalFetch
from tests.agent.proxy_harness import TOKEN, bearer, inference_keys, serve_asgi

BASE = "tiny-llama"
LIMIT = 1024 * 1024
HUGE = 256 * 1024 * 1024


@dataclass
class Rig:
    url: str
    client: httpx.AsyncClient
    metrics: AgentMetrics
    bodies: list[bytes]  # what vLLM received

    def count(self, status: str) -> float:
        return sum(s.value for family in self.metrics.registry.collect()
                   for s in family.samples
                   if s.name == "loraplane_agent_requests_total"
                   and s.labels.get("status") == status)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    bodies: list[bytes] = []

    async def completions(request: Request) -> JSONResponse:
        bodies.append(await request.body())
        return JSONResponse({"model": BASE, "choices": [{"text": "hi"}]})

    vllm_app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
    metrics, leases, routes = AgentMetrics(), Leases(), RouteTable(BASE)
    materializer = Materializer(tmp_path / "cache", max_bytes=10**9, fetch=LocalFetch(),
                                base_shapes=None, max_rank=16, metrics=metrics)
    cache = AdapterCache(cast(VllmClient, FakeVllm()), materializer, leases, capacity=2,
                         metrics=metrics, load_wait_timeout_s=5, is_routed=routes.is_routed)
    async with serve_asgi(vllm_app) as vllm_url:
        app = create_proxy_app(routes=routes, cache=cache, leases=leases, metrics=metrics,
                               vllm_url=vllm_url, base_model=BASE, registry=None,
                               keys=inference_keys(), max_body_bytes=LIMIT)
        async with serve_asgi(app) as url, httpx.AsyncClient(
                base_url=url, headers=bearer(TOKEN)) as client:
            yield Rig(url, client, metrics, bodies)


async def raw_post(url: str, head: dict[str, str], first_bytes: bytes
                   ) -> tuple[int, dict[str, str], Any]:
    """Send a request's head and the start of its body, then read the whole answer:
    the rest of the body is never sent, so an answer proves it was not waited for."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        lines = ["POST /v1/completions HTTP/1.1", f"Host: {host}",
                 "Content-Type: application/json", *(f"{k}: {v}" for k, v in head.items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + first_bytes)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    header_block, _, body = rest.partition(b"\r\n\r\n")
    headers = {name.lower(): value for name, value in (
        line.decode().split(": ", 1) for line in header_block.split(b"\r\n"))}
    return int(status_line.split()[1]), headers, json.loads(body)


@pytest.mark.parametrize(("authorization", "code"), [
    (None, "missing_api_key"), ("Bearer lp_not-a-token", "invalid_api_key")])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_an_unauthenticated_body_is_refused_before_it_is_read(
        rig: Rig, authorization: str | None, code: str, framing: str) -> None:
    head = ({"Content-Length": str(HUGE)} if framing == "content-length"
            else {"Transfer-Encoding": "chunked"})
    if authorization is not None:
        head["Authorization"] = authorization
    start = b'{"prompt": "' + b"a" * 65536
    if framing == "chunked":
        start = b"%x\r\n" % len(start) + start + b"\r\n"
    # 64 KiB of a 256 MiB body: the 401 comes without the rest.
    status, headers, body = await raw_post(rig.url, head, start)
    assert status == 401 and body["error"]["code"] == code
    assert headers["connection"] == "close"  # the unread rest cannot carry a request
    assert headers["www-authenticate"] == "Bearer"
    assert rig.count("401") == 1 and rig.bodies == []


async def test_an_authenticated_body_over_the_limit_is_a_413(rig: Rig) -> None:
    # Declared: refused from the head alone.
    status, headers, body = await raw_post(
        rig.url, {"Authorization": f"Bearer {TOKEN}", "Content-Length": str(HUGE)}, b"{")
    assert status == 413 and body["error"]["code"] == "body_too_large"
    assert headers["connection"] == "close"

    # Chunked: cut off once it crosses the limit.
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(LIMIT // 65536 + 2):
            yield b"a" * 65536
        yield b'"}'

    response = await rig.client.post("/v1/completions", content=chunks())
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"
    assert rig.count("413") == 2 and rig.bodies == []
    # At the limit it goes through.
    prompt = "a" * (LIMIT - 64)
    response = await rig.client.post("/v1/completions", json={"prompt": prompt})
    assert response.status_code == 200, response.text
    assert len(rig.bodies) == 1


@pytest.mark.parametrize("depth", [200_000, 2_000, 600])
async def test_a_deeply_nested_body_is_a_400(rig: Rig, depth: int) -> None:
    deep = b"[" * depth + b"]" * depth
    response = await rig.client.post(
        "/v1/completions", content=b'{"prompt": "x", "extra": ' + deep + b"}",
        headers={"Content-Type": "application/json"})
    if depth == 600:
        # orjson reads it but does not write it: passed on as the library writes it.
        assert response.status_code == 200, response.text
        assert json.loads(rig.bodies[-1])["extra"] is not None
        return
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "json_too_deep"
