"""The front door (serving/front_door.py) under a real uvicorn: the generation POSTs go
to the handler with their body and headers, everything else to the Starlette app, and
the in-flight count comes back to zero however a request ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from inference_agent.serving.front_door import FrontDoor
from inference_agent.serving.streams import Inflight
from tests.agent.loop_support import one_loop_turn
from tests.agent.proxy_harness import serve_asgi


class Handler:
    def __init__(self, inflight: Inflight) -> None:
        self.inflight = inflight
        self.seen: list[tuple[str, bytes, str | None]] = []
        self.started = asyncio.Event()
        self.fail = False

    async def __call__(self, headers: Headers, body: bytes, path: str) -> Response:
        self.seen.append((path, body, headers.get("x-request-id")))
        self.started.set()
        if self.fail:
            raise RuntimeError("a bug in the handler")
        return JSONResponse({"path": path, "inflight": self.inflight.count})


async def _other(request: Request) -> Response:
    return PlainTextResponse("starlette")


def door() -> tuple[FrontDoor, Handler, Inflight]:
    inflight = Inflight()
    handler = Handler(inflight)
    app = Starlette(routes=[Route("/v1/completions", _other, methods=["POST"]),
                            Route("/healthz", _other)])
    app.state.inflight = inflight
    return FrontDoor(app, handler, inflight), handler, inflight


async def test_generation_posts_reach_the_handler_and_the_rest_starlette() -> None:
    front, handler, inflight = door()
    assert front.state.inflight is inflight
    async with serve_asgi(front) as url, httpx.AsyncClient(base_url=url) as client:
        for path in ("/v1/completions", "/v1/chat/completions"):
            answer = await client.post(path, content=b'{"x": 1}',
                                       headers={"X-Request-Id": "r7"})
            assert answer.json() == {"path": path, "inflight": 1}
        # A body sent in pieces arrives whole.
        pieces = (b'{"long": "', b"a" * 70000, b'"}')

        async def chunked() -> AsyncIterator[bytes]:
            for piece in pieces:
                yield piece

        answer = await client.post("/v1/completions", content=chunked())
        assert answer.status_code == 200
        assert (await client.get("/v1/completions")).status_code == 405
        assert (await client.get("/healthz")).text == "starlette"
    assert handler.seen[:2] == [("/v1/completions", b'{"x": 1}', "r7"),
                                ("/v1/chat/completions", b'{"x": 1}', "r7")]
    assert handler.seen[2][1] == b"".join(pieces) and inflight.count == 0


async def test_a_handler_that_raises_is_a_500_and_leaves_nothing_in_flight() -> None:
    front, handler, inflight = door()
    handler.fail = True
    async with serve_asgi(front) as url, httpx.AsyncClient(base_url=url) as client:
        answer = await client.post("/v1/completions", content=b"{}")
    assert answer.status_code == 500 and inflight.count == 0


async def test_a_client_gone_before_its_body_is_in_leaves_nothing_in_flight() -> None:
    front, handler, inflight = door()
    async with serve_asgi(front) as url:
        port = int(url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n"
                     b"content-length: 100\r\n\r\n{\"partial")
        await writer.drain()
        while inflight.count == 0:  # the door has the request and waits for its body
            await one_loop_turn()
        writer.close()
        await writer.wait_closed()
        while inflight.count != 0:
            await one_loop_turn()
        del reader
    assert handler.seen == []
