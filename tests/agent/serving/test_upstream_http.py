"""The proxy's hand-written HTTP/1.1 client (serving/upstream_http.py) against real
sockets: servers written here byte by byte, so that each way an HTTP server may
answer (lengths, chunks, a closed connection, silence, garbage) happens on demand."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvloop

from inference_agent.serving.openai_errors import ProxyError
from inference_agent.serving.upstream import Upstream
from inference_agent.serving.upstream_http import (
    HIGH_WATER,
    UpstreamClosed,
    UpstreamPool,
    UpstreamResponse,
)
from tests.agent.loop_support import one_loop_turn

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class Server:
    """A TCP server running ``handler(reader, writer, connection number)``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []  # every request head received, in order
        self.url = ""
        self._writers: list[asyncio.StreamWriter] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        with contextlib.suppress(ConnectionError):
            await self.handler(reader, writer, self.connections)

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        """One request's head and body, recorded; None if the client closed."""
        request = await read_one(reader)
        if request is not None:
            self.requests.append(request)
        return request


async def read_one(reader: asyncio.StreamReader) -> bytes | None:
    """One request's head and body; None if the client closed the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head + await reader.readexactly(length)


def answers_and_closes(data: bytes) -> Handler:
    """A server that reads a request, writes ``data`` and closes the connection."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      number: int) -> None:
        await read_one(reader)
        writer.write(data)
        await writer.drain()
        writer.close()
    return handler


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[Server]:
    server = Server(handler)
    listener = await asyncio.start_server(server._serve, "127.0.0.1", 0)
    server.url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    try:
        yield server
    finally:
        listener.close()
        for writer in server._writers:
            writer.close()
        await listener.wait_closed()


def pool(url: str, *, read_timeout_s: float = 30, max_connections: int = 8) -> UpstreamPool:
    return UpstreamPool(url, read_timeout_s=read_timeout_s, connect_timeout_s=5,
                        keepalive_s=30, max_connections=max_connections)


def answer(body: bytes, *extra: bytes) -> bytes:
    head = [b"HTTP/1.1 200 OK", b"content-type: application/json",
            b"content-length: %d" % len(body), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


async def test_one_connection_serves_request_after_request() -> None:
    async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         number: int) -> None:
        while await server.read_request(reader) is not None:
            writer.write(answer(b'{"n": %d}' % len(server.requests), b"x-request-id: r1"))

    async with serving(keep_alive) as server:
        client = pool(server.url + "/prefix/")
        for n in range(1, 6):
            response = await client.request("POST", "/v1/completions", b'{"a": 1}',
                                            {"Content-Type": "application/json",
                                             "x-request-id": "r1"})
            assert (response.status, await response.read()) == (200, b'{"n": %d}' % n)
            assert response.headers["content-type"] == "application/json"
            assert response.headers["x-request-id"] == "r1" and response.closed
        await client.aclose()
    assert server.connections == 1
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /prefix/v1/completions HTTP/1.1"
    assert b"content-length: 8" in lines and b"x-request-id: r1" in lines
    assert any(line.startswith(b"host: 127.0.0.1:") for line in lines)
    assert body == b'{"a": 1}'


async def test_a_chunked_answer_comes_as_it_is_sent_and_the_connection_is_reused() -> None:
    sent_second = asyncio.Event()
    go_on = asyncio.Event()

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      number: int) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n7\r\ndata: 0\r\n")
        await go_on.wait()  # the client has the first chunk before the second is sent
        writer.write(b"7\r\ndata: 1\r\n0\r\n\r\n")
        sent_second.set()
        await server.read_request(reader)
        writer.write(answer(b"again"))

    async with serving(chunked) as server:
        client = pool(server.url)
        response = await client.request("POST", "/s", b"{}", {})
        chunks = response.iter_chunks()
        assert await anext(chunks) == b"data: 0"
        go_on.set()
        assert [chunk async for chunk in chunks] == [b"data: 1"]
        again = await client.request("POST", "/s", b"{}", {})
        assert await again.read() == b"again"
        await client.aclose()
    assert server.connections == 1 and sent_second.is_set()


async def test_a_body_that_ends_with_the_connection() -> None:
    http10 = b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it"
    async with serving(answers_and_closes(http10)) as server:
        client = pool(server.url)
        for _ in range(2):
            response = await client.request("GET", "/health", b"", {})
            assert await response.read() == b"all of it"
        await client.aclose()
    assert server.connections == 2  # nothing to reuse: the end of the body closed it


async def test_a_reused_connection_the_server_closed_is_retried_once() -> None:
    async def closes_when_reused(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                 number: int) -> None:
        while await server.read_request(reader) is not None:
            if number == 1 and len(server.requests) == 2:
                writer.close()  # as a server closing an idle connection would
                return
            writer.write(answer(b"ok %d" % number))

    async with serving(closes_when_reused) as server:
        client = pool(server.url)
        first = await client.request("POST", "/v1/completions", b"{}", {})
        assert await first.read() == b"ok 1"
        second = await client.request("POST", "/v1/completions", b"{}", {})
        assert await second.read() == b"ok 2"
        await client.aclose()
    assert server.connections == 2 and len(server.requests) == 3


async def test_a_new_connection_closed_unanswered_is_not_retried() -> None:
    async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       number: int) -> None:
        await server.read_request(reader)
        writer.close()

    async with serving(hangs_up) as server:
        upstream = Upstream(server.url, request_timeout_s=30, connect_timeout_s=5)
        refused = await upstream.post("/v1/completions", b"{}", {})
        assert isinstance(refused, ProxyError)
        assert (refused.status, refused.code) == (503, "vllm_unavailable")
        await upstream.aclose()
    assert server.connections == 1


async def test_garbage_is_refused_as_an_unreachable_vllm() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      number: int) -> None:
        await server.read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")

    async with serving(garbage) as server:
        upstream = Upstream(server.url, request_timeout_s=30, connect_timeout_s=5)
        refused = await upstream.post("/v1/completions", b"{}", {})
        assert isinstance(refused, ProxyError) and refused.status == 503
        assert "not HTTP" in refused.message
        await upstream.aclose()


async def test_silence_between_bytes_times_out_and_closing_early_hangs_up() -> None:
    hung_up = asyncio.Event()

    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     number: int) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
        if await reader.read(1) == b"":  # nothing more comes: the client closed
            hung_up.set()

    async with serving(stalls) as server:
        client = pool(server.url, read_timeout_s=0.2)
        response = await client.request("POST", "/s", b"{}", {})
        chunks = response.iter_chunks()
        assert await anext(chunks) == b"a"
        with pytest.raises(TimeoutError):
            await anext(chunks)
        response.close()
        await asyncio.wait_for(hung_up.wait(), 30)
        await client.aclose()


async def test_a_slow_reader_stops_the_socket_and_loses_nothing() -> None:
    size = 8 * 1024 * 1024
    payload = bytes(range(256)) * (size // 256)

    async def floods(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     number: int) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        for start in range(0, size, 65536):
            writer.write(payload[start:start + 65536])
            await writer.drain()

    async with serving(floods) as server:
        client = pool(server.url)
        response = await client.request("POST", "/big", b"{}", {})
        connection = response._connection
        while not connection._paused:  # the client reads nothing until the socket stops
            await one_loop_turn()
        assert connection._buffered <= HIGH_WATER + 1024 * 1024
        assert await response.read() == payload
        await client.aclose()


async def test_requests_wait_for_a_free_connection_under_the_cap() -> None:
    release = asyncio.Event()

    async def slow_then_fast(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                             number: int) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nab")
        await release.wait()
        writer.write(b"cd")
        await server.read_request(reader)
        writer.write(answer(b"second"))

    async with serving(slow_then_fast) as server:
        client = pool(server.url, max_connections=1)
        first = await client.request("POST", "/a", b"{}", {})
        second = asyncio.create_task(client.request("POST", "/b", b"{}", {}))
        while not client._freed:  # the second request waits for the only connection
            await one_loop_turn()
        release.set()
        assert await first.read() == b"abcd"
        assert await (await second).read() == b"second"
        await client.aclose()
    assert server.connections == 1


async def test_a_header_with_a_line_break_is_not_sent() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   number: int) -> None:
        await server.read_request(reader)
        writer.write(answer(b"{}"))

    async with serving(echo) as server:
        client = pool(server.url)
        response = await client.request("POST", "/v1/completions", b"{}",
                                        {"x-request-id": "a\r\nx-evil: 1", "x-ok": "1"})
        assert isinstance(response, UpstreamResponse) and await response.read() == b"{}"
        await client.aclose()
    head = server.requests[0]
    assert b"x-evil" not in head and b"x-ok: 1" in head


async def test_an_answer_cut_short_is_an_error() -> None:
    cut = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"
    async with serving(answers_and_closes(cut)) as server:
        client = pool(server.url)
        response = await client.request("POST", "/a", b"{}", {})
        with pytest.raises(UpstreamClosed):
            await response.read()
        await client.aclose()


def test_under_uvloop_as_the_agent_runs() -> None:
    """The agent's loop is uvloop, whose transports are not asyncio's own classes."""
    async def scenario() -> int:
        async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                             number: int) -> None:
            while await server.read_request(reader) is not None:
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                             b"2\r\nhi\r\n0\r\n\r\n")

        async with serving(keep_alive) as server:
            client = pool(server.url)
            for _ in range(3):
                response = await client.request("POST", "/s", b"{}", {})
                assert await response.read() == b"hi"
            await client.aclose()
        return server.connections

    assert uvloop.run(scenario()) == 1
