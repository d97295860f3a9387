"""The endings of a passed-back stream that vLLM cannot be made to produce on demand.

The upstream is a real HTTP server (uvicorn) streaming SSE; what varies is how the
stream ends: the upstream dies mid-stream, or an ASGI 2.4 server reports the client
gone by raising from ``send``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from starlette.types import Message

from inference_agent.serving.streams import Inflight, UpstreamStream
from inference_agent.serving.upstream import Upstream
from inference_agent.serving.upstream_http import UpstreamResponse
from tests.agent.loop_support import one_loop_turn
from tests.agent.proxy_harness import serve_asgi

CHUNKS = 5


async def _events(request: Request) -> StreamingResponse:
    crash = request.query_params.get("crash") == "1"

    async def body() -> AsyncIterator[bytes]:
        for i in range(CHUNKS):
            yield f"data: {i}\n\n".encode()
            await asyncio.sleep(0.02)
            if crash and i == 1:
                raise RuntimeError("upstream died mid-stream")
        yield b"data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


UPSTREAM = Starlette(routes=[Route("/events", _events, methods=["POST"])])


class Recorder:
    def __init__(self, fail_after: int | None = None) -> None:
        self.sent: list[Message] = []
        self.done: list[tuple[int, str | None]] = []
        self.fail_after = fail_after

    async def send(self, message: Message) -> None:
        if self.fail_after is not None and len(self.sent) >= self.fail_after:
            raise OSError("client gone")  # what ASGI 2.4 servers do
        self.sent.append(message)

    async def receive(self) -> Message:
        await asyncio.Event().wait()  # the client never says anything
        raise AssertionError("unreachable")

    def on_done(self, status: int, reason: str | None) -> None:
        self.done.append((status, reason))

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


async def pass_back(query: str, recorder: Recorder) -> UpstreamResponse:
    async with serve_asgi(UPSTREAM) as url:
        client = Upstream(url, request_timeout_s=30, connect_timeout_s=5)
        try:
            upstream = await client.post(f"/events{query}", b"{}", {})
            assert isinstance(upstream, UpstreamResponse), upstream
            response = UpstreamStream(upstream, {"X-Loraplane-Adapter": "a@1"},
                                      recorder.on_done)
            await response({"type": "http", "asgi": {"spec_version": "2.4"}},
                           recorder.receive, recorder.send)
            return upstream
        finally:
            await client.aclose()


async def test_a_whole_stream_is_passed_back_and_ends_once() -> None:
    recorder = Recorder()
    upstream = await pass_back("", recorder)
    assert recorder.body().count(b"data: ") == CHUNKS + 1
    assert recorder.sent[-1] == {"type": "http.response.body", "body": b"",
                                 "more_body": False}
    headers = dict(recorder.sent[0]["headers"])
    assert headers[b"x-loraplane-adapter"] == b"a@1"
    assert recorder.done == [(200, None)] and upstream.closed


async def test_an_upstream_that_dies_mid_stream_gets_an_error_event() -> None:
    recorder = Recorder()
    upstream = await pass_back("?crash=1", recorder)
    body = recorder.body()
    assert body.startswith(b"data: 0\n\ndata: 1\n\n")
    assert b'"code": "vllm_unavailable"' in body and b"[DONE]" not in body
    assert recorder.sent[-1]["more_body"] is False
    assert recorder.done == [(200, "vllm_stream_broken")] and upstream.closed


async def test_a_send_that_raises_is_a_client_disconnect() -> None:
    recorder = Recorder(fail_after=2)  # the start and one chunk get through
    upstream = await pass_back("", recorder)
    assert recorder.done == [(200, "client_disconnected")] and upstream.closed


async def test_inflight_waits_for_zero() -> None:
    inflight = Inflight()
    assert await inflight.wait_zero(0.01)
    inflight.enter()
    inflight.enter()
    assert not await inflight.wait_zero(0.01)
    inflight.leave()
    waiter = asyncio.create_task(inflight.wait_zero(5.0))
    await one_loop_turn()  # the waiter has looked at the count and waits
    assert not waiter.done()
    inflight.leave()
    assert await waiter and inflight.count == 0
