"""A small HTTP/1.1 client for the proxy's calls to vLLM: keep-alive connections,
requests written in one send, responses parsed by httptools (llhttp, in C).

The proxy makes one call to vLLM per request it serves, so this client is on every
request's path. aiohttp's request and response objects, its payload registry, timers
and stream readers are built for any server; this talks to one, which it trusts to
speak HTTP/1.1. Why: docs/decisions.md#the-proxy-has-its-own-http-client-to-vllm

What it does: ``Content-Length`` and chunked responses (and, from an HTTP/1.0 peer, a
body that ends with the connection), a read timeout between bytes, a connect timeout,
a cap on connections, idle connections dropped after ``keepalive_s``, back-pressure on
a stream the caller reads slowly, and one retry of a request whose reused connection
was found closed before any byte of an answer came back (the peer had closed it while
idle, as vLLM does after 5 s; nothing was answered, so nothing is sent twice to a
client). What it does not: redirects, cookies, proxies, compression (it asks for none,
and bytes go back to the client as vLLM sent them).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import httptools

T = TypeVar("T")

# Stop reading from vLLM while this much of a stream waits for the client.
HIGH_WATER = 256 * 1024


class UpstreamClosed(ConnectionError):
    """The connection ended, or the answer could not be parsed, before the answer did."""


class UpstreamResponse:
    """vLLM's answer: status and headers at once, the body read whole or as it comes.

    Header names are lower case; a header sent twice keeps its last value. The body
    must be read to its end or ``close()``d: closing an unfinished answer closes its
    connection, which makes vLLM abort the generation.
    """

    def __init__(self, connection: _Connection, status: int,
                 headers: dict[str, str]) -> None:
        self._connection = connection
        self.status = status
        self.headers = headers

    @property
    def closed(self) -> bool:
        return self._connection.response is not self

    async def read(self) -> bytes:
        """The whole body; raises ``UpstreamClosed`` or ``TimeoutError``."""
        chunks: list[bytes] = []
        while (chunk := await self._connection.next_chunk(self)) is not None:
            chunks.append(chunk)
        return b"".join(chunks)

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (chunked framing removed)."""
        connection = self._connection
        while True:
            chunk = await connection.next_chunk(self)
            if chunk is None:
                return
            yield chunk

    def close(self) -> None:
        """Give the connection back if the answer is complete, else close it."""
        self._connection.finish(self)


class _Connection(asyncio.Protocol):
    """One keep-alive connection and the answer being read on it, if any."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.used = 0  # requests sent on it
        self.idle_since = 0.0
        self.lost = False
        self._reset()

    def _reset(self) -> None:
        self._headers: dict[str, str] = {}
        self._head: asyncio.Future[UpstreamResponse] | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._complete = False
        self._keep_alive = False
        self._error: BaseException | None = None
        self._any_byte = False
        self._paused = False

    # the transport's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._head is None and self.response is None:
            self.close_transport()  # bytes nobody asked for: the stream is out of step
            return
        self._any_byte = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamClosed(f"the model server's answer is not HTTP: {exc}"))
            self.close_transport()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pool.forget(self)
        if self._complete:
            return
        if self._ends_with_connection():
            self._complete = True
            self._wake()
        else:
            self._fail(UpstreamClosed(f"the model server closed the connection ({exc!r})"))

    def _ends_with_connection(self) -> bool:
        # An answer with neither a length nor chunks runs until the connection ends.
        return (self._head is None and self.response is not None
                and "content-length" not in self._headers
                and "transfer-encoding" not in self._headers)

    # the parser's side

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        head = self._head
        self._head = None
        if head is not None and not head.done():
            self.response = UpstreamResponse(self, self.parser.get_status_code(),
                                             self._headers)
            head.set_result(self.response)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        # Asked here: once the parser has moved on, llhttp no longer knows.
        self._keep_alive = self.parser.should_keep_alive()
        self._complete = True
        self._wake()

    # the caller's side

    def send(self, head: bytes, body: bytes) -> asyncio.Future[UpstreamResponse]:
        """Write a request; the future has the answer once its headers are in."""
        assert self.transport is not None and self.response is None
        self._reset()
        self.used += 1
        self._head = self.loop.create_future()
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        return self._head

    @property
    def answered_nothing(self) -> bool:
        return not self._any_byte

    async def next_chunk(self, response: UpstreamResponse) -> bytes | None:
        """The next piece of the body, or None at its end."""
        while True:
            if self.response is not response:
                raise UpstreamClosed("the answer was closed")
            if self._chunks:
                return self._take()
            if self._error is not None:
                raise self._error
            if self._complete:
                self.finish(response)
                return None
            await self._wait(self.pool.read_timeout_s)

    def _take(self) -> bytes:
        chunk = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    async def _wait(self, timeout_s: float) -> None:
        self._waiter = self.loop.create_future()
        try:
            await within(self.loop, self._waiter, timeout_s, "no byte from the model server")
        finally:
            self._waiter = None

    def finish(self, response: UpstreamResponse) -> None:
        """The caller is done with ``response``: reuse the connection if it can be."""
        if self.response is not response:
            return
        self.response = None
        if self._complete and self._keep_alive and not self._chunks \
                and self._error is None and not self.lost:
            self.pool.release(self)
        else:
            self.close_transport()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        self._error = error
        head, self._head = self._head, None
        if head is not None and not head.done():
            head.set_exception(error)
        self._wake()

    def close_transport(self) -> None:
        self.lost = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.close()


async def within(loop: asyncio.AbstractEventLoop, future: asyncio.Future[T],
                 timeout_s: float, what: str) -> T:
    """``await future``, failed with ``TimeoutError`` after ``timeout_s``: one timer
    handle, cheaper than ``asyncio.timeout`` on a path taken per request and chunk."""
    timer = loop.call_later(timeout_s, _expire, future, f"{what} in {timeout_s} s")
    try:
        return await future
    finally:
        timer.cancel()


def _expire(future: asyncio.Future[Any], message: str) -> None:
    if not future.done():
        future.set_exception(TimeoutError(message))


class UpstreamPool:
    """Keep-alive connections to one HTTP server, reused newest first."""

    def __init__(self, base_url: str, *, read_timeout_s: float, connect_timeout_s: float,
                 keepalive_s: float, max_connections: int) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._tls = parts.scheme == "https"
        self._prefix = parts.path.rstrip("/")
        self._host_header = parts.netloc.rpartition("@")[2].encode("idna")
        self.read_timeout_s = read_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._slots = max_connections  # connections that may still be opened
        # Requests waiting at the cap for a connection to be given back or closed.
        self._freed: collections.deque[asyncio.Future[None]] = collections.deque()
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def keepalive_s(self) -> float:
        """How long an idle connection is kept for reuse."""
        return self._keepalive_s

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    async def request(self, method: str, path: str, body: bytes,
                      headers: Mapping[str, str]) -> UpstreamResponse:
        """Send a request; the answer once its headers are in. Raises ``OSError``
        (``UpstreamClosed`` among them) or ``TimeoutError``."""
        head = self._head(method, path, len(body), headers)
        for attempt in (1, 2):
            connection = await self._connection()
            try:
                return await self._answer(connection.send(head, body))
            except UpstreamClosed:
                connection.close_transport()
                if attempt == 2 or not (connection.used > 1 and connection.answered_nothing):
                    raise
                # The peer had closed this idle connection as we reused it: nothing was
                # answered, so the request goes again on a new connection.
            except BaseException:
                connection.close_transport()
                raise
        raise AssertionError("unreachable")

    async def _answer(self, head: asyncio.Future[UpstreamResponse]) -> UpstreamResponse:
        return await within(self.loop, head, self.read_timeout_s,
                            "the model server did not answer")

    def _head(self, method: str, path: str, length: int,
              headers: Mapping[str, str]) -> bytes:
        lines = [f"{method} {self._prefix}{path} HTTP/1.1".encode(),
                 b"host: " + self._host_header, b"content-length: %d" % length]
        for name, value in headers.items():
            line = f"{name}: {value}"
            # Never a header of the caller's that would end this one early.
            if "\r" not in line and "\n" not in line:
                lines.append(line.encode("latin-1", "replace"))
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def _connection(self) -> _Connection:
        """An idle connection, or a new one; at the cap, the first of them to free up."""
        while True:
            now = time.monotonic()
            while self._idle:
                connection = self._idle.pop()
                if not connection.lost and now - connection.idle_since < self._keepalive_s:
                    return connection
                connection.close_transport()
            if self._slots > 0:
                return await self._connect()
            waiter = self.loop.create_future()
            self._freed.append(waiter)
            try:
                await waiter
            except BaseException:
                with contextlib.suppress(ValueError):
                    self._freed.remove(waiter)
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken, then cancelled: the next in line goes
                raise

    async def _connect(self) -> _Connection:
        self._slots -= 1
        try:
            connection = _Connection(self)
            async with asyncio.timeout(self._connect_timeout_s):
                await self.loop.create_connection(
                    lambda: connection, self._host, self._port,
                    ssl=True if self._tls else None)
        except BaseException:
            self._slots += 1
            self._wake_one()
            raise
        self._open.add(connection)
        return connection

    def _wake_one(self) -> None:
        """Tell one request waiting at the cap that a connection or a slot is free."""
        while self._freed:
            waiter = self._freed.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def release(self, connection: _Connection) -> None:
        connection.idle_since = time.monotonic()
        self._idle.append(connection)
        self._wake_one()

    def forget(self, connection: _Connection) -> None:
        if connection in self._open:
            self._open.discard(connection)
            self._slots += 1
            self._wake_one()
        with contextlib.suppress(ValueError):
            self._idle.remove(connection)

    async def aclose(self) -> None:
        """Close every connection, idle or busy."""
        for connection in list(self._open):
            connection.close_transport()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks

