"""The agent's connection protocol (serving/direct_protocol.py) under a real uvicorn,
over raw sockets: a generation answer goes out in one write, byte for byte what
uvicorn's own protocol sends, and keep-alive, ``Connection: close``, HTTP/1.0,
pipelining, ``Expect: 100-continue``, streams, errors, clients that leave, the
concurrency limit and shutdown behave as under uvicorn's own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from inference_agent.http_server import HTTP_PROTOCOL, KEEP_ALIVE_S, QuietServer
from inference_agent.serving.direct_protocol import GenerationProtocol, write_whole
from inference_agent.serving.front_door import FrontDoor
from inference_agent.serving.streams import Inflight
from loraplane.netutil import free_port
from tests.agent.loop_support import one_loop_turn, running

PROTOCOLS = ("httptools", HTTP_PROTOCOL)


class Handler:
    """Answers by the request's body: ``stream``, ``raise``, ``bad-header``, ``wait``
    (until ``release`` is set), else a JSON echo."""

    def __init__(self, inflight: Inflight) -> None:
        self.inflight = inflight
        self.calls = 0
        self.waiting = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, headers: Headers, body: bytes, path: str) -> Response:
        self.calls += 1
        if body == b"stream":
            return StreamingResponse(_pieces(), media_type="text/event-stream")
        if body == b"raise":
            raise RuntimeError("a bug in the handler")
        if body == b"bad-header":
            return PlainTextResponse("x", headers={"x-request-id": "a\r\nx-injected: 1"})
        if body == b"wait":
            self.waiting.set()
            await self.release.wait()
        return JSONResponse({"path": path, "body": body.decode(),
                             "id": headers.get("x-request-id"),
                             "inflight": self.inflight.count},
                            headers={"x-loraplane-adapter": "base"})


async def _pieces() -> AsyncIterator[bytes]:
    for piece in (b"data: 1\n\n", b"data: [DONE]\n\n"):
        yield piece


async def _other(request: Request) -> Response:
    return PlainTextResponse("starlette")


def door() -> tuple[FrontDoor, Handler]:
    inflight = Inflight()
    app = Starlette(routes=[Route("/v1/completions", _other, methods=["POST"]),
                            Route("/healthz", _other)])
    handler = Handler(inflight)
    return FrontDoor(app, handler, inflight), handler


@contextlib.asynccontextmanager
async def served(app: Any, protocol: Any, **options: Any
                 ) -> AsyncIterator[tuple[int, QuietServer]]:
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            lifespan="off", http=protocol, timeout_graceful_shutdown=30,
                            access_log=False, timeout_keep_alive=KEEP_ALIVE_S,  # as the agent
                            **options)
    server = QuietServer(config, clock=lambda: 1_000_000_000.0)  # one fixed date
    async with running(server):
        yield port, server


def post(body: bytes, *head: bytes, path: bytes = b"/v1/completions",
         version: bytes = b"1.1") -> bytes:
    lines = [b"POST " + path + b" HTTP/" + version, b"host: agent",
             b"content-length: %d" % len(body), *head]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def read_answer(reader: asyncio.StreamReader) -> bytes:
    """One whole answer: its head, then its content-length body or its chunks."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = re.search(rb"\r\ncontent-length: (\d+)\r\n", head)
    if length is not None:
        return head + await reader.readexactly(int(length.group(1)))
    if b"\r\ntransfer-encoding: chunked\r\n" in head:
        return head + await reader.readuntil(b"0\r\n\r\n")
    return head


async def exchange(port: int, *requests: bytes) -> list[bytes]:
    """Each request's answer on one connection. An answer that says
    ``connection: close`` must be followed by the server closing the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        answers = []
        for request in requests:
            writer.write(request)
            answers.append(await read_answer(reader))
        if b"\r\nconnection: close\r\n" in answers[-1]:
            # Well before the idle connection's own end (KEEP_ALIVE_S).
            async with asyncio.timeout(KEEP_ALIVE_S / 2):
                assert await reader.read() == b""
        return answers
    finally:
        writer.close()


KEEP = (post(b"one", b"x-request-id: r1"), post(b"two", b"Connection: keep-alive"))
ENDINGS = {"keep-alive": KEEP,
           "client closes": (post(b"one"), post(b"two", b"Connection: close")),
           "HTTP/1.0": (post(b"one", version=b"1.0"),),
           "stream": (post(b"stream"), post(b"one")),
           "other route": (post(b"one", path=b"/healthz"), post(b"one"))}


@pytest.mark.parametrize("case", sorted(ENDINGS))
async def test_the_answers_are_uvicorns_own_bytes(case: str) -> None:
    seen = []
    for protocol in PROTOCOLS:
        front, _handler = door()
        async with served(front, protocol) as (port, _server):
            seen.append(await exchange(port, *ENDINGS[case]))
    assert seen[0] == seen[1]
    answers = seen[1]
    assert all(answer.startswith(b"HTTP/1.1 ") for answer in answers)
    if case == "keep-alive":
        assert b'"id":"r1"' in answers[0] and b"connection" not in answers[1]
    if case in ("client closes", "HTTP/1.0"):
        assert answers[-1].count(b"\r\nconnection: close\r\n") == 1


async def _writes_of(port: int, server: QuietServer, *requests: bytes
                    ) -> list[list[bytes]]:
    """What the server wrote for each request, on one connection; the first request
    opens it and is not counted."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(post(b"one"))
        await read_answer(reader)
        (protocol,) = server.server_state.connections
        assert isinstance(protocol, GenerationProtocol)
        transport_write = protocol.transport.write
        writes: list[list[bytes]] = []

        def write(data: bytes) -> None:
            writes[-1].append(bytes(data))
            transport_write(data)

        protocol.transport.write = write  # type: ignore[method-assign,assignment]
        for request in requests:
            writes.append([])
            writer.write(request)
            answer = await read_answer(reader)
            assert b"".join(writes[-1]) == answer
        return writes
    finally:
        writer.close()


async def test_a_whole_answer_is_one_write_and_a_stream_is_uvicorns() -> None:
    front, _handler = door()
    async with served(front, HTTP_PROTOCOL) as (port, server):
        whole, stream = await _writes_of(port, server, post(b"one"), post(b"stream"))
    assert len(whole) == 1 and len(stream) > 2


async def test_with_a_context_per_task_uvicorn_answers() -> None:
    front, _handler = door()
    async with served(front, HTTP_PROTOCOL, reset_contextvars=True) as (port, server):
        (whole,) = await _writes_of(port, server, post(b"one"))
    assert len(whole) == 2 and b'"body":"one"' in whole[1]


async def test_pipelined_requests_are_answered_in_order() -> None:
    front, handler = door()
    async with served(front, HTTP_PROTOCOL) as (port, _server):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post(b"wait") + post(b"second") + post(b"stream"))
        await handler.waiting.wait()
        handler.release.set()
        answers = [await read_answer(reader) for _ in range(3)]
        writer.close()
    assert b'"body":"wait"' in answers[0] and b'"body":"second"' in answers[1]
    assert answers[2].endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert front.inflight.count == 0


async def test_expect_100_continue_is_answered_before_the_body() -> None:
    front, _handler = door()
    async with served(front, HTTP_PROTOCOL) as (port, _server):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = post(b"one", b"Expect: 100-continue")
        head, body = request.split(b"\r\n\r\n")
        writer.write(head + b"\r\n\r\n")
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        answer = await read_answer(reader)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b'"body":"one"' in answer


@pytest.mark.parametrize("body", [b"raise", b"bad-header"])
async def test_a_handler_error_is_a_500_and_leaves_nothing_in_flight(body: bytes) -> None:
    front, _handler = door()
    async with served(front, HTTP_PROTOCOL) as (port, _server):
        (answer,) = await exchange(port, post(body))
    assert answer.startswith(b"HTTP/1.1 500 ") and b"\r\nconnection: close\r\n" in answer
    assert b"injected" not in answer and front.inflight.count == 0


async def test_a_client_gone_before_its_answer_is_not_answered(
        caplog: pytest.LogCaptureFixture) -> None:
    front, handler = door()
    async with served(front, HTTP_PROTOCOL) as (port, server):
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post(b"wait"))
        await handler.waiting.wait()
        writer.close()
        await writer.wait_closed()
        while server.server_state.connections:  # the server saw the client leave
            await one_loop_turn()
        handler.release.set()
        while front.inflight.count != 0:
            await one_loop_turn()
        (answer,) = await exchange(port, post(b"after"))  # and serves on
    assert b'"body":"after"' in answer and handler.calls == 2
    assert "Exception in ASGI application" not in caplog.text


async def test_shutdown_finishes_the_request_in_flight_and_closes() -> None:
    front, handler = door()
    async with served(front, HTTP_PROTOCOL) as (port, server):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post(b"wait"))
        await handler.waiting.wait()
        server.should_exit = True
        (connection,) = server.server_state.connections
        assert isinstance(connection, GenerationProtocol)
        while connection.cycle.keep_alive:
            await one_loop_turn()  # uvicorn told the connection to close after it
        handler.release.set()
        answer = await read_answer(reader)
        assert await reader.read() == b""
        writer.close()
    assert b'"body":"wait"' in answer and b"\r\nconnection: close\r\n" in answer
    assert front.inflight.count == 0


async def test_over_the_concurrency_limit_uvicorn_answers_503() -> None:
    front, handler = door()
    async with served(front, HTTP_PROTOCOL, limit_concurrency=1) as (port, _server):
        (answer,) = await exchange(port, post(b"one"))
    assert answer.startswith(b"HTTP/1.1 503 ") and handler.calls == 0


async def test_an_app_that_is_not_a_front_door_is_served_as_uvicorn_would() -> None:
    app = Starlette(routes=[Route("/v1/completions", _other, methods=["POST"])])
    async with served(app, HTTP_PROTOCOL) as (port, _server):
        (answer,) = await exchange(port, post(b"one"))
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"starlette")


class _Transport:
    """What a cycle writes, and whether it closed the connection."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _cycle(headers: list[tuple[bytes, bytes]], transport: _Transport,
           done: list[bool]) -> RequestResponseCycle:
    scope: Any = {"type": "http", "method": "POST", "path": "/v1/completions",
                  "headers": headers}
    return RequestResponseCycle(
        scope=scope, transport=transport, flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("test"), access_logger=logging.getLogger("test.access"),
        access_log=False, default_headers=[(b"server", b"agent")],
        message_event=asyncio.Event(), expect_100_continue=False, keep_alive=True,
        on_response=lambda: done.append(True))


@pytest.mark.parametrize("connection", [b"close", b"Keep-Alive, Close"])
async def test_a_client_asking_to_close_is_closed_whatever_uvicorn_decided(
        connection: bytes) -> None:
    # uvicorn before 0.53 leaves the request's ``Connection: close`` to its ``send``,
    # with the cycle's ``keep_alive`` still set: the writer must see it itself.
    transport, done = _Transport(), list[bool]()
    cycle = _cycle([(b"connection", connection)], transport, done)
    assert await write_whole(cycle, PlainTextResponse("ok"))
    assert transport.closed and done == [True] and not cycle.keep_alive
    (written,) = transport.written
    assert written.startswith(b"HTTP/1.1 200 OK\r\nserver: agent\r\n")
    assert written.endswith(b"\r\nconnection: close\r\n\r\nok")


async def test_what_the_writer_does_not_write_is_left_to_uvicorns_send() -> None:
    for response in (StreamingResponse(_pieces()), Response(status_code=204),
                     PlainTextResponse("x", headers={"connection": "close"}),
                     PlainTextResponse("x", background=BackgroundTask(_nothing))):
        transport, done = _Transport(), list[bool]()
        cycle = _cycle([], transport, done)
        assert not await write_whole(cycle, response)
        assert transport.written == [] and done == [] and not cycle.response_started


async def _nothing() -> None:
    return None
