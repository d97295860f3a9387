"""The floor proxies of ``bench/proxy_floor.py`` (the byte relay and Debian's nginx),
started for real in front of a small upstream: each carries requests and answers
unchanged, and keeps one upstream connection for a client's kept-alive connection, as
a fair floor must (a new upstream connection per request would cost more than the
agent pays)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import httpx
from starlette.types import Receive, Scope, Send

from bench.proxy_floor import floor_proxies
from tests.agent.proxy_harness import serve_asgi

REQUESTS = 20


class Upstream:
    """Answers /health, and echoes a POST's body reversed, noting the peer's port."""

    def __init__(self) -> None:
        self.peers: list[int] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/echo":
            self.peers.append(scope["client"][1])
        answer = body[::-1] if scope["path"] == "/echo" else b"ok"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})


async def test_each_floor_proxy_carries_requests_on_one_kept_alive_connection(
        tmp_path: Path) -> None:
    upstream = Upstream()
    async with serve_asgi(upstream, lifespan="off") as url, contextlib.AsyncExitStack() as stack:
        sync = contextlib.ExitStack()
        stack.push_async_callback(asyncio.to_thread, sync.close)
        # Started in a thread: their readiness probe is synchronous, and the upstream
        # answering it runs on this loop.
        proxies = await asyncio.to_thread(sync.enter_context,
                                          floor_proxies(url, tmp_path / "floor"))
        assert [p.name for p in proxies] == ["relay", "nginx"]
        for proxy in proxies:
            upstream.peers.clear()
            async with httpx.AsyncClient(base_url=proxy.url) as client:
                for index in range(REQUESTS):
                    body = f"request {index} through {proxy.name}".encode() * 100
                    response = await client.post("/echo", content=body)
                    assert response.status_code == 200, proxy.name
                    assert response.content == body[::-1], proxy.name
            assert len(upstream.peers) == REQUESTS
            assert len(set(upstream.peers)) == 1, (proxy.name, set(upstream.peers))
